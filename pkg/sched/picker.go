package sched

import (
	"sort"

	"github.com/laneway-dev/laneway/pkg/drr"
	"github.com/laneway-dev/laneway/pkg/picker"
)

// Candidate is an eligible endpoint as a Picker sees it.
type Candidate struct {
	ID            drr.EndpointID
	Addr          string
	ActivePrefill uint64
	InFlight      int
	// Busy is the class's busy test for this endpoint; a picker should
	// prefer endpoints that are not busy. A stale endpoint is always busy.
	Busy bool
	// Stale: the endpoint's metrics are expected but stale or not scraped
	// yet; a picker should rank it after every endpoint with fresh ones.
	Stale bool
	// CachedTokens is how many of the request's prompt tokens the endpoint
	// probably has in its prefix cache (the prefix index's overlap).
	CachedTokens uint64
	// UnseenPrefill is the busy test's estimate of prompt tokens in prefill
	// there that this picker did not send (from the engine's queue).
	UnseenPrefill uint64
	// Decoding is the sequences running there: the larger of this
	// picker's requests past their first byte and the engine's running
	// count at its last scrape.
	Decoding int
}

// Picker orders eligible endpoints by preference for one request. It
// appends indexes of cands to out and returns it: every index once, best
// first. Only the first 1 + MaxFallbacks entries are used, so a picker may
// leave the entries after those in any order. It runs on the goroutine that owns
// the Core and must not block.
type Picker interface {
	Pick(t *Ticket, cands []Candidate, out []int) []int
}

// CostPicker is the prefix- and load-aware picker: among eligible
// endpoints it prefers fresh metrics over stale, not busy over busy, then
// the lowest cost in blocks — the request's prompt blocks left to prefill
// there after its cached overlap, plus the endpoint's active prefill
// (including unseen load), plus its decode load, one block per running
// sequence — with random tie-breaks (pkg/picker).
type CostPicker struct {
	want  int
	r     *picker.Ranker
	loads []picker.Load
}

// NewCostPicker returns a CostPicker that orders the best want endpoints
// (the pick and its fallbacks); seed drives the tie-breaks.
func NewCostPicker(want int, seed uint64) *CostPicker {
	return &CostPicker{want: max(want, 1), r: picker.NewRanker(seed)}
}

// Pick implements Picker.
func (p *CostPicker) Pick(t *Ticket, cands []Candidate, out []int) []int {
	p.loads = p.loads[:0]
	for i := range cands {
		c := &cands[i]
		p.loads = append(p.loads, picker.Load{
			Stale:         c.Stale,
			Busy:          c.Busy,
			Prefill:       drr.Uncached(t.RawISL, c.CachedTokens),
			ActivePrefill: drr.SaturatingAdd(c.ActivePrefill, c.UnseenPrefill),
			Decode:        uint64(c.Decoding),
		})
	}
	bs := t.BlockSize
	if bs <= 0 {
		bs = DefaultBlockSize
	}
	return p.r.Rank(p.loads, bs, p.want, out)
}

// LeastLoaded prefers endpoints that are not busy, then the fewest active
// prefill tokens, then the fewest in-flight requests, then address order.
// It ignores prefix overlap, unseen load and staleness (beyond the busy
// flag): it is the baseline the cost picker is measured against.
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
