package epp

import "github.com/laneway-dev/laneway/pkg/tokenize"

// Tokenizer reads a request body for the picker in one pass: the prompt's
// token ids and the fields the picker reads besides them (model, agent
// hints, where the priority is). Every token count and prefix hash of the
// picker comes from one Tokenizer, so the class buckets, limits, costs and
// the prefix index all agree.
type Tokenizer interface {
	// Extract appends the prompt's token ids to dst and fills f (see
	// tokenize.Extract); an error means the body is malformed (400) and
	// names the field.
	Extract(dst []uint32, body []byte, f *tokenize.Fields) ([]uint32, error)
}

// EstimateTokenizer is the default Tokenizer: pkg/tokenize's deterministic
// estimate for text (about four characters per token) and the ids as given
// for token-id prompts, whose counts are therefore exact. It needs no model
// vocabulary, and the simulator hashes prompts the same way.
type EstimateTokenizer struct{}

// Extract implements Tokenizer.
func (EstimateTokenizer) Extract(dst []uint32, body []byte, f *tokenize.Fields) ([]uint32, error) {
	return tokenize.Extract(dst, body, f)
}
