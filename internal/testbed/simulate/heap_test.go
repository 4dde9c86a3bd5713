package simulate

import (
	"testing"

	"github.com/laneway-dev/laneway/pkg/iheap/iheaptest"
)

// TestEventHeapConformance runs iheap's conformance suite against the
// simulation's event heap: rank is the time (shifted so that some times
// are negative), id the event's idx, its tie breaker at one time and kind.
// Events never leave early, so they record no position and the suite skips
// those steps.
func TestEventHeapConformance(t *testing.T) {
	iheaptest.Run(t, func(*testing.T) iheaptest.Adapter {
		q := newEventHeap()
		return &eventAdapter{q: &q}
	})
}

type eventAdapter struct{ q *eventHeap }

func (a *eventAdapter) Push(id, rank int) {
	a.q.push(event{at: int64(rank) - iheaptest.MaxRank/2, kind: evScrape, idx: int32(id)})
}

func (a *eventAdapter) Pop() int     { return int(a.q.pop().idx) }
func (a *eventAdapter) Len() int     { return a.q.len() }
func (a *eventAdapter) At(i int) int { return int(a.q.h.At(i).idx) }
