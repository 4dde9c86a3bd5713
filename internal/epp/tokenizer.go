package epp

import "github.com/laneway-dev/laneway/pkg/tokenize"

// Tokenizer turns a request body into its prompt's token ids. Every token
// count and prefix hash of the picker comes from one Tokenizer, so the
// class buckets, limits, costs and the prefix index all agree.
type Tokenizer interface {
	// AppendPromptTokens appends the prompt's token ids to dst; an error
	// means the body is malformed (400).
	AppendPromptTokens(dst []uint32, body []byte) ([]uint32, error)
}

// EstimateTokenizer is the default Tokenizer: pkg/tokenize's deterministic
// estimate for text (about four characters per token) and the ids as given
// for token-id prompts, whose counts are therefore exact. It needs no model
// vocabulary, and the simulator hashes prompts the same way.
type EstimateTokenizer struct{}

// AppendPromptTokens implements Tokenizer.
func (EstimateTokenizer) AppendPromptTokens(dst []uint32, body []byte) ([]uint32, error) {
	return tokenize.ExtractPrompt(dst, body)
}
