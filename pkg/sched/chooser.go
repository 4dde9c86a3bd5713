package sched

import (
	"cmp"
	"math/rand/v2"
	"slices"

	"github.com/laneway-dev/laneway/pkg/affinity"
	"github.com/laneway-dev/laneway/pkg/drr"
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
	// LoRATier is the request's adapter preference for the endpoint: 0
	// where the adapter runs (or for every endpoint, for a base-model
	// request), 1 where there is room to load it, 2 elsewhere. A picker
	// should rank it before load among endpoints that are fresh and not
	// busy (SPEC §5, LoRA adapters).
	LoRATier uint8
}

// Chooser orders eligible endpoints by preference for one request. It
// appends indexes of cands to out and returns it: every index once, best
// first. Only the first 1 + MaxFallbacks entries are used, so a picker may
// leave the entries after those in any order. It runs on the goroutine that owns
// the Core and must not block.
type Chooser interface {
	Choose(t *Ticket, cands []Candidate, out []int) []int
}

// CostChooser is the prefix- and load-aware chooser: among eligible
// endpoints it prefers fresh metrics over stale, not busy over busy, then
// the lower LoRA tier, then the lowest cost in blocks — the request's prompt blocks left to prefill
// there after its cached overlap, plus the endpoint's active prefill
// (including unseen load), plus its decode load, one block per running
// sequence — with random tie-breaks (pkg/affinity).
type CostChooser struct {
	want  int
	r     *affinity.Ranker
	loads []affinity.Load
}

// NewCostChooser returns a CostChooser that orders the best want endpoints
// (the pick and its fallbacks); seed drives the tie-breaks.
func NewCostChooser(want int, seed uint64) *CostChooser {
	return &CostChooser{want: max(want, 1), r: affinity.NewRanker(seed)}
}

// Choose implements Chooser.
func (p *CostChooser) Choose(t *Ticket, cands []Candidate, out []int) []int {
	p.loads = p.loads[:0]
	for i := range cands {
		c := &cands[i]
		p.loads = append(p.loads, affinity.Load{
			Stale:         c.Stale,
			Busy:          c.Busy,
			Prefill:       drr.Uncached(t.RawISL, c.CachedTokens),
			ActivePrefill: drr.SaturatingAdd(c.ActivePrefill, c.UnseenPrefill),
			Decode:        uint64(c.Decoding),
			Affinity:      c.LoRATier,
		})
	}
	bs := t.BlockSize
	if bs <= 0 {
		bs = DefaultBlockSize
	}
	return p.r.Rank(p.loads, bs, p.want, out)
}

// LeastLoaded prefers endpoints that are not busy, then the lower LoRA
// tier, then the fewest active prefill tokens, then the fewest in-flight
// requests, and breaks the ties
// that remain at random (as the cost picker does): equally loaded
// endpoints share the requests instead of the first address taking them.
// It ignores prefix overlap, unseen load and staleness (beyond the busy
// flag): it is the baseline the cost picker is measured against. The zero
// value draws from the global generator; NewLeastLoaded gives a seeded one.
type LeastLoaded struct {
	rng *rand.Rand
}

// NewLeastLoaded returns a LeastLoaded whose tie-breaks follow seed.
func NewLeastLoaded(seed uint64) LeastLoaded {
	return LeastLoaded{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Choose implements Chooser.
func (l LeastLoaded) Choose(_ *Ticket, cands []Candidate, out []int) []int {
	base := len(out)
	for i := range cands {
		out = append(out, i)
	}
	idx := out[base:]
	// Shuffle, then sort stably: equal keys end up in random order.
	for i := len(idx) - 1; i > 0; i-- {
		var j int
		if l.rng != nil {
			j = l.rng.IntN(i + 1)
		} else {
			j = rand.IntN(i + 1)
		}
		idx[i], idx[j] = idx[j], idx[i]
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		x, y := &cands[a], &cands[b]
		switch {
		case x.Busy != y.Busy:
			if x.Busy {
				return 1
			}
			return -1
		case x.LoRATier != y.LoRATier:
			return cmp.Compare(x.LoRATier, y.LoRATier)
		case x.ActivePrefill != y.ActivePrefill:
			return cmp.Compare(x.ActivePrefill, y.ActivePrefill)
		}
		return cmp.Compare(x.InFlight, y.InFlight)
	})
	return out
}
