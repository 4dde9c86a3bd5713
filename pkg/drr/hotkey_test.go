package drr

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// TestHotKeyIsOrderPrefix: a strictly smaller key prefix must mean the
// item goes first under the full order, for every policy and for values at
// the edges (tiers around the 4-bit cap, extreme times and costs).
func TestHotKeyIsOrderPrefix(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	strict := []uint32{0, 1, 14, 15, 16, 20, math.MaxUint32}
	times := []int64{math.MinInt64, -1, 0, 1, 31, 32, 33, 1 << 40, math.MaxInt64 - 1, math.MaxInt64}
	sizes := []uint64{0, 1, 2, 3, 1 << 31, 1<<32 - 1, 1 << 32, 1 << 63, math.MaxUint64}
	prios := []int32{math.MinInt32, -1, 0, 1, 2, 1000, math.MaxInt32}
	random := func(p Policy, budget time.Duration, seq uint64) *Item {
		it := &Item{Request: Request{
			RawISL:         sizes[rng.IntN(len(sizes))],
			Cached:         sizes[rng.IntN(len(sizes))],
			Priority:       prios[rng.IntN(len(prios))],
			StrictPriority: strict[rng.IntN(len(strict))],
			Arrival:        times[rng.IntN(len(times))],
		}, seq: seq}
		if rng.IntN(3) == 0 {
			it.Due = times[rng.IntN(len(times))]
		}
		if rng.IntN(4) == 0 {
			it.Arrival = rng.Int64()
			it.RawISL = rng.Uint64()
		}
		if it.Cached > it.RawISL {
			it.Cached = it.RawISL
		}
		cfg := ClassConfig{Policy: p, WaitBudget: budget}
		it.setKey(&cfg)
		return it
	}
	for _, p := range []Policy{FCFS, WSPT, EDF} {
		for _, budget := range []time.Duration{0, time.Second} {
			for n := 0; n < 200_000; n++ {
				a, b := random(p, budget, 1), random(p, budget, 2)
				ha, hb := hotKey(a), hotKey(b)
				if ha < hb && !before(a, b) {
					t.Fatalf("%v: hot %x < %x but b goes first\na=%+v\nb=%+v", p, ha, hb, a, b)
				}
				if ahead(ha, a, hb, b) != before(a, b) {
					t.Fatalf("%v: ahead = %v, before = %v\na=%+v\nb=%+v", p, ahead(ha, a, hb, b), before(a, b), a, b)
				}
			}
		}
	}
}

// ahead is the order of the lanes' heaps (iheap's): the key prefixes, then
// before on equal prefixes.
func ahead(ka uint64, a *Item, kb uint64, b *Item) bool {
	if ka != kb {
		return ka < kb
	}
	return before(a, b)
}

// TestTenKeyIsOrderPrefix: a strictly smaller tenant key must mean the
// tenant goes first in the tenant ring, at the edges of the tier cap and
// of the 30-bit saturation of rounds and positions.
func TestTenKeyIsOrderPrefix(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	strict := []uint32{0, 1, 14, 15, 16, math.MaxUint32}
	vals := []uint64{0, 1, 2, 1<<30 - 2, 1<<30 - 1, 1 << 30, 1<<30 + 1, 1 << 40, math.MaxUint64}
	random := func() *tenant {
		tn := &tenant{sub: lane{h: newItemHeap()}, at: vals[rng.IntN(len(vals))], pos: vals[rng.IntN(len(vals))]}
		tn.sub.push(&Item{strict: strict[rng.IntN(len(strict))]})
		return tn
	}
	for n := 0; n < 200_000; n++ {
		a, b := random(), random()
		if ka, kb := tenKey(a), tenKey(b); ka < kb && !tenLess(a, b) {
			t.Fatalf("key %x < %x but b goes first\na: tier %d round %d position %d\nb: tier %d round %d position %d",
				ka, kb, a.sub.head().strict, a.at, a.pos, b.sub.head().strict, b.at, b.pos)
		}
	}
}
