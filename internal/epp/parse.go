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
type BodyParser struct{}

var _ RequestParser = BodyParser{}

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
func (BodyParser) Parse(req *extproc.Request, t *dispatcher.Ticket) error {
	buf := tokenBufs.Get().(*[]uint32)
	toks, err := tokenize.ExtractPrompt((*buf)[:0], req.Body)
	n := len(toks)
	*buf = toks[:0]
	tokenBufs.Put(buf)
	if err != nil {
		return fmt.Errorf("request body: %w", err)
	}
	var f bodyFields
	if err := json.Unmarshal(req.Body, &f); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return fmt.Errorf("request body: field %s: %s does not fit %s", te.Field, te.Value, te.Type)
		}
		return fmt.Errorf("request body: %w", err)
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
	t.Strict = h.StrictPriority
	return nil
}
