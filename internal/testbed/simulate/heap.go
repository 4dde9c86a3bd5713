package simulate

// Event kinds of the simulation's heap (arrivals come from the trace in
// order and need no heap).
const (
	evWake     uint8 = iota // a server's step ends (idx: server, gen)
	evScrape                // a server's metrics are scraped (idx: server)
	evRetry                 // a request answered 429 is offered again (idx: request)
	evDeadline              // a queued request's wait budget runs out
	evTransfer              // a disaggregated request's KV cache reaches its decode server (idx: request)
)

// event is one future happening. Events of one instant are processed in
// (kind, idx) order, so a run is deterministic.
type event struct {
	at   int64
	kind uint8
	idx  int32
	gen  uint32
}

func (a *event) before(b *event) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	if a.kind != b.kind {
		return a.kind < b.kind
	}
	return a.idx < b.idx
}

// eventHeap is a binary min-heap of events by time.
type eventHeap struct{ h []event }

func (q *eventHeap) len() int    { return len(q.h) }
func (q *eventHeap) top() *event { return &q.h[0] }
func (q *eventHeap) push(e event) {
	q.h = append(q.h, e)
	h := q.h
	for j := len(h) - 1; j > 0; {
		i := (j - 1) / 2
		if !h[j].before(&h[i]) {
			break
		}
		h[i], h[j] = h[j], h[i]
		j = i
	}
}

func (q *eventHeap) pop() event {
	h := q.h
	e := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	for i := 0; ; {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h[r].before(&h[l]) {
			m = r
		}
		if !h[m].before(&h[i]) {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	q.h = h
	return e
}
