package simulate

import "github.com/laneway-dev/laneway/pkg/iheap"

// Event kinds of the simulation's heap (arrivals come from the trace in
// order and need no heap).
const (
	evWake     uint8 = iota // a server's step ends (idx: server, gen)
	evScrape                // a server's metrics are scraped (idx: server)
	evRetry                 // a request answered 429 is offered again (idx: request)
	evDeadline              // a queued request's wait budget runs out
	evTransfer              // a disaggregated request's KV cache reaches its decode server (idx: request)
	evRestart               // a server restarts (idx: Options.Restarts index)
)

// event is one future happening. Events of one instant are processed in
// (kind, idx) order, so a run is deterministic.
type event struct {
	at   int64
	kind uint8
	idx  int32
	gen  uint32
}

func (a event) before(b event) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	if a.kind != b.kind {
		return a.kind < b.kind
	}
	return a.idx < b.idx
}

// eventHeap is a min-heap of events by time: an iheap.Heap keyed by the
// time (sign flipped so that the unsigned key keeps the order of negative
// times too), with before breaking ties. Events never leave early, so they
// keep no position.
type eventHeap struct{ h iheap.Heap[event] }

func newEventHeap() eventHeap { return eventHeap{h: iheap.New(event.before)} }

func (q *eventHeap) len() int     { return q.h.Len() }
func (q *eventHeap) top() event   { return q.h.At(0) }
func (q *eventHeap) push(e event) { q.h.Push(uint64(e.at)^1<<63, e, nil) }
func (q *eventHeap) pop() event   { return q.h.Pop() }
