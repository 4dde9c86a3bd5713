package dispatcher

import (
	"sort"

	"github.com/laneway-dev/laneway/pkg/drr"
)

// Candidate is an eligible endpoint as a Picker sees it.
type Candidate struct {
	ID            drr.EndpointID
	Addr          string
	ActivePrefill uint64
	InFlight      int
	// Busy is the class's busy test for this endpoint; a picker should
	// prefer endpoints that are not busy.
	Busy bool
}

// Picker orders eligible endpoints by preference for one request. It
// appends indexes of cands to out (every index once, best first) and
// returns it. It runs on the dispatcher's loop and must not block.
type Picker interface {
	Pick(t *Ticket, cands []Candidate, out []int) []int
}

// LeastLoaded prefers endpoints that are not busy, then the fewest active
// prefill tokens, then the fewest in-flight requests, then address order.
type LeastLoaded struct{}

// Pick implements Picker.
func (LeastLoaded) Pick(_ *Ticket, cands []Candidate, out []int) []int {
	for i := range cands {
		out = append(out, i)
	}
	sort.SliceStable(out, func(a, b int) bool {
		x, y := &cands[out[a]], &cands[out[b]]
		if x.Busy != y.Busy {
			return !x.Busy
		}
		if x.ActivePrefill != y.ActivePrefill {
			return x.ActivePrefill < y.ActivePrefill
		}
		return x.InFlight < y.InFlight
	})
	return out
}
