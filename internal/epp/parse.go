package epp

import (
	"sync"

	"github.com/laneway-dev/laneway/pkg/extproc"
	"github.com/laneway-dev/laneway/pkg/policy"
	"github.com/laneway-dev/laneway/pkg/sched"
	"github.com/laneway-dev/laneway/pkg/tokenize"
)

// BodyParser reads an OpenAI-style request: the model, the prompt's token
// count (SPEC §1 raw_isl) and the hints of SPEC §6 from body and headers.
// The body is read once, by the Tokenizer, which also says where the
// body's priority is; through ParseBlocks the prompt is hashed into
// prefix-cache blocks from the same tokens.
type BodyParser struct {
	// Tokenizer reads the body; nil means EstimateTokenizer.
	Tokenizer Tokenizer
}

var (
	_ RequestParser = BodyParser{}
	_ BlockParser   = BodyParser{}
)

// BlockParser is a RequestParser that also hands out what the rest of the
// request needs from the body's single pass: Ticket.Blocks, the prompt's
// chained block hashes at blockSize tokens per block (0: none), appended
// to dst (a buffer the caller recycles once the dispatcher is done with
// the ticket), and the body's fields in f (where a forwarded priority is
// spliced).
type BlockParser interface {
	ParseBlocks(req *extproc.Request, t *sched.Ticket, blockSize int, dst []uint64, f *tokenize.Fields) error
}

// tokenBufs recycles token slices: a 32k-token prompt would otherwise cost
// a 128 kB allocation per request.
var tokenBufs = sync.Pool{New: func() any { s := make([]uint32, 0, 4096); return &s }}

// Parse implements RequestParser.
func (p BodyParser) Parse(req *extproc.Request, t *sched.Ticket) error {
	var f tokenize.Fields
	return p.ParseBlocks(req, t, 0, nil, &f)
}

// ParseBlocks implements BlockParser.
func (p BodyParser) ParseBlocks(req *extproc.Request, t *sched.Ticket, blockSize int, dst []uint64, f *tokenize.Fields) error {
	if len(req.Body) == 0 {
		// A request without a body (GET /v1/models) is decided on its
		// headers (SPEC §7): no model, no prompt, the header hints only.
		*f = tokenize.Fields{Priority: tokenize.PrioritySpans{Values: f.Priority.Values[:0], Keys: f.Priority.Keys[:0]}}
		p.applyHints(req, t, f, 0)
		return nil
	}
	tok := p.Tokenizer
	if tok == nil {
		tok = EstimateTokenizer{}
	}
	buf := tokenBufs.Get().(*[]uint32)
	toks, err := tok.Extract((*buf)[:0], req.Body, f)
	n := len(toks)
	if err == nil && blockSize > 0 {
		t.Blocks = tokenize.AppendBlockHashes(dst, toks, blockSize)
		t.BlockSize = blockSize
	}
	*buf = toks[:0]
	tokenBufs.Put(buf)
	if err != nil {
		return err // it names the byte and the field
	}
	p.applyHints(req, t, f, n)
	return nil
}

// applyHints fills t from the body's fields f and the request's headers,
// for a prompt of n tokens.
func (BodyParser) applyHints(req *extproc.Request, t *sched.Ticket, f *tokenize.Fields, n int) {
	var h policy.Hints
	h.ApplyAgentHints(f.Hints)
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
	// The expected output, for the auto threshold: the osl hint says what
	// the client expects, a max_tokens only bounds it.
	switch {
	case h.HasOSL:
		t.OutputTokens = uint64(h.OSL)
	case f.HasMaxTokens:
		t.OutputTokens = uint64(f.MaxTokens)
	default:
		t.OutputTokens = 0
	}
}
