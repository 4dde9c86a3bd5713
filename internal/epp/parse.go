package epp

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/laneway-dev/laneway/internal/dispatcher"
	"github.com/laneway-dev/laneway/pkg/extproc"
	"github.com/laneway-dev/laneway/pkg/policy"
	"github.com/laneway-dev/laneway/pkg/tokenize"
)

// BodyParser reads an OpenAI-style request: the model, the prompt's token
// count (SPEC §1 raw_isl) and the hints of SPEC §6 from body and headers.
// Through ParseBlocks it also hashes the prompt into prefix-cache blocks,
// in the same pass over the tokens.
type BodyParser struct {
	// Tokenizer counts the prompt; nil means EstimateTokenizer.
	Tokenizer Tokenizer
}

var (
	_ RequestParser = BodyParser{}
	_ BlockParser   = BodyParser{}
)

// BlockParser is a RequestParser that can also fill Ticket.Blocks: the
// prompt's chained block hashes at blockSize tokens per block, appended to
// dst (a buffer the caller recycles once the dispatcher is done with the
// ticket).
type BlockParser interface {
	ParseBlocks(req *extproc.Request, t *dispatcher.Ticket, blockSize int, dst []uint64) error
}

// tokenBufs recycles token slices: a 32k-token prompt would otherwise cost
// a 128 kB allocation per request.
var tokenBufs = sync.Pool{New: func() any { s := make([]uint32, 0, 4096); return &s }}

// bodyFields is the part of the body besides the prompt that scheduling
// reads.
type bodyFields struct {
	Model string        `json:"model"`
	NVExt *policy.NVExt `json:"nvext"`
}

// Parse implements RequestParser.
func (p BodyParser) Parse(req *extproc.Request, t *dispatcher.Ticket) error {
	return p.ParseBlocks(req, t, 0, nil)
}

// ParseBlocks implements BlockParser; blockSize 0 computes no hashes.
func (p BodyParser) ParseBlocks(req *extproc.Request, t *dispatcher.Ticket, blockSize int, dst []uint64) error {
	tok := p.Tokenizer
	if tok == nil {
		tok = EstimateTokenizer{}
	}
	buf := tokenBufs.Get().(*[]uint32)
	toks, err := tok.AppendPromptTokens((*buf)[:0], req.Body)
	n := len(toks)
	if err == nil && blockSize > 0 {
		t.Blocks = tokenize.AppendBlockHashes(dst, toks, blockSize)
		t.BlockSize = blockSize
	}
	*buf = toks[:0]
	tokenBufs.Put(buf)
	if err != nil {
		return fmt.Errorf("request body: %w", err)
	}
	f, err := readBodyFields(req.Body)
	if err != nil {
		return err
	}
	var h policy.Hints
	if f.NVExt != nil {
		h.ApplyAgentHints(f.NVExt.AgentHints)
	}
	var hh policy.HeaderHints
	for k, v := range req.Headers {
		hh.Observe(k, v)
	}
	hh.Apply(&h)
	t.Model = f.Model
	t.ClassHeader = h.Class
	t.RawISL = uint64(n)
	t.Priority = h.Priority
	t.HasPriority = h.HasPriority
	t.Strict = h.StrictPriority
	return nil
}

// readBodyFields decodes the body's model and nvext members. The tokenizer
// has validated the whole body, so a byte scan finds the members and only
// their values are decoded: decoding the whole body would scan a long
// prompt a second time at a fraction of the speed. Keys match as
// encoding/json matches struct fields (case-insensitively, the last of
// duplicates wins).
func readBodyFields(body []byte) (bodyFields, error) {
	var f bodyFields
	_, err := forEachMember(body, func(key []byte, vs, ve int) error {
		v := body[vs:ve]
		var err error
		var name string
		switch {
		case keyFolds(key, "model"):
			name = "model"
			if s, ok := plainString(v); ok {
				f.Model = s // what json.Unmarshal would decode, without its allocations
				return nil
			}
			// Decoding into a copy keeps f on the stack; starting from the
			// current value keeps encoding/json's handling of a null
			// duplicate (the earlier value stays).
			m := f.Model
			err = json.Unmarshal(v, &m)
			f.Model = m
		case keyFolds(key, "nvext"):
			name = "nvext"
			n := f.NVExt
			err = json.Unmarshal(v, &n)
			f.NVExt = n
		default:
			return nil
		}
		if err != nil {
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) {
				field := name
				if te.Field != "" {
					field += "." + te.Field
				}
				return fmt.Errorf("request body: field %s: %s does not fit %s", field, te.Value, te.Type)
			}
			return fmt.Errorf("request body: field %s: %w", name, err)
		}
		return nil
	})
	if errors.Is(err, errNotObject) {
		err = fmt.Errorf("request body: %w", err)
	}
	return f, err
}
