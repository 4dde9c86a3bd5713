package epp

import (
	"sync"

	"github.com/laneway-dev/laneway/pkg/extproc"
	"github.com/laneway-dev/laneway/pkg/sched"
	"github.com/laneway-dev/laneway/pkg/tokenize"
)

// The Handler's per-request state between the parse and the answer: the
// ticket, the parse state the grant still needs, both recycled, and the
// hooks that see a routed request.

// RequestHooks extend the Handler around the dispatcher.
type RequestHooks interface {
	// BlockSize is the prefix hashing block size for the next request; 0
	// computes no hashes.
	BlockSize() int
	// Routed sees every request that got an endpoint, with where its
	// body's priority members are (from the parser's pass; nil when the
	// parser is no BlockParser); a non-nil result replaces the body sent
	// upstream.
	Routed(req *extproc.Request, t *sched.Ticket, g *sched.Grant, at *tokenize.PrioritySpans) []byte
}

// tickets recycles tickets: the dispatcher is done with one once Acquire
// returned a grant or an error other than the caller's cancellation.
var tickets = sync.Pool{New: func() any { return new(sched.Ticket) }}

func putTicket(t *sched.Ticket) {
	*t = sched.Ticket{}
	tickets.Put(t)
}

// parsed is what a request's parse leaves for after the grant: the buffer
// Ticket.Blocks points into and the body's fields (where its priority is
// spliced). They are recycled: 2,048 hashes for a 32k-token prompt would
// otherwise be a 16 kB allocation per request.
type parsed struct {
	blocks []uint64
	fields tokenize.Fields
}

var parsedPool = sync.Pool{New: func() any { return &parsed{blocks: make([]uint64, 0, 512)} }}

// maxKeptBlocks and maxKeptSpans bound the buffers parsedPool keeps (a
// 16 MiB body could make one of several MiB).
const (
	maxKeptBlocks = 1 << 16
	maxKeptSpans  = 64
)

// parse runs the parser: through BlockParser when there are hooks, so the
// prompt's block hashes (when the hooks ask for them) and the body's
// priority spans come from its one pass. The state it returns goes back
// with recycleParsed.
func (h *Handler) parse(req *extproc.Request, t *sched.Ticket) (*parsed, error) {
	if h.Hooks != nil {
		if bp, ok := h.Parser.(BlockParser); ok {
			ps := parsedPool.Get().(*parsed)
			return ps, bp.ParseBlocks(req, t, h.Hooks.BlockSize(), ps.blocks[:0], &ps.fields)
		}
	}
	return nil, h.Parser.Parse(req, t)
}

// recycleParsed returns a request's parse state to the pool; call it only
// once the dispatcher is done with the ticket.
func recycleParsed(ps *parsed, t *sched.Ticket) {
	if ps == nil {
		return
	}
	if t.Blocks != nil {
		ps.blocks = t.Blocks[:0]
		t.Blocks = nil
	}
	ps.fields.Model = ""
	if cap(ps.blocks) <= maxKeptBlocks && cap(ps.fields.Priority.Values) <= maxKeptSpans {
		parsedPool.Put(ps)
	}
}

// routed applies the hooks to a granted request.
func (h *Handler) routed(req *extproc.Request, t *sched.Ticket, g *sched.Grant, ps *parsed) []byte {
	if h.Hooks == nil {
		return nil
	}
	var at *tokenize.PrioritySpans
	if ps != nil {
		at = &ps.fields.Priority
	}
	return h.Hooks.Routed(req, t, g, at)
}
