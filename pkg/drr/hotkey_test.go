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
				sa, sb := slot{hotKey(a), a}, slot{hotKey(b), b}
				if sa.hot < sb.hot && !before(a, b) {
					t.Fatalf("%v: hot %x < %x but b goes first\na=%+v\nb=%+v", p, sa.hot, sb.hot, a, b)
				}
				if ahead(&sa, &sb) != before(a, b) {
					t.Fatalf("%v: ahead = %v, before = %v\na=%+v\nb=%+v", p, ahead(&sa, &sb), before(a, b), a, b)
				}
			}
		}
	}
}
