package drr

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestFairnessBound checks the DRR service guarantee on random workloads.
//
// Take classes that stay backlogged and never blocked. Class i has been
// granted R_i rounds of credit (ring visits and bulk virtual rounds alike)
// and holds deficit D_i, so its service is S_i = R_i·q_i − D_i (no deficit
// reset: it never empties). Grants go around the ring in order, and bulk
// rounds replay round-by-round DRR (every candidate gets the same number of
// rounds except those after the dispatcher in the last one, which get it at
// their next visit), so |R_i − R_j| <= 1. A grant happens
// only when D < head cost, and bulk rounds stop at the first affordable
// class, so 0 <= D_j < maxcost_j + q_j. Hence at every moment
//
//	S_i/q_i − S_j/q_j = (R_i − R_j) − D_i/q_i + D_j/q_j < 2 + maxcost_j/q_j,
//
// i.e. S_i·q_j − S_j·q_i < (2·q_j + maxcost_j)·q_i. A permanently blocked
// class in the ring must not disturb this.
func TestFairnessBound(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		t.Run(fmt.Sprintf("seed %d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			nc := 2 + rng.IntN(4)
			cfgs := make([]ClassConfig, nc+1)
			maxCost := make([]uint64, nc)
			for i := 0; i < nc; i++ {
				cfgs[i] = qclass(fmt.Sprintf("c%d", i), 1+rng.Uint64N(2000), FCFS)
				maxCost[i] = 1 + rng.Uint64N(8000)
			}
			// The last class is blocked throughout.
			cfgs[nc] = qclass("blocked", 1+rng.Uint64N(100), FCFS)
			s := mustNew(t, cfgs...)
			arrival := int64(0)
			add := func(c int) {
				arrival++
				enqueue(t, s, Request{Class: int32(c), Pinned: NoEndpoint, RawISL: 1 + rng.Uint64N(maxCost[c]), Arrival: arrival})
			}
			for c := 0; c < nc; c++ {
				for k := 0; k < 4; k++ {
					add(c)
				}
			}
			enqueue(t, s, Request{Class: int32(nc), Pinned: 1, RawISL: 10})
			p := newProbe()
			p.lanes[1] = Blocked
			served := make([]uint64, nc)
			for n := 0; n < 10_000; n++ {
				it, out := s.Pop(0, p)
				if out != Dispatch {
					t.Fatalf("pop %d: outcome %v; want Dispatch", n, out)
				}
				c := int(it.Class)
				if c == nc {
					t.Fatalf("pop %d dispatched the blocked class", n)
				}
				served[c] += it.Cost()
				add(c) // stay backlogged
				for i := 0; i < nc; i++ {
					for j := 0; j < nc; j++ {
						qi, qj := cfgs[i].Quantum, cfgs[j].Quantum
						lhs := int64(served[i]*qj) - int64(served[j]*qi)
						bound := int64((2*qj + maxCost[j]) * qi)
						if lhs >= bound {
							t.Fatalf("after %d pops: S_%d/q_%d - S_%d/q_%d = %.2f rounds; bound 2 + %d/%d = %.2f\nserved %v quanta %v",
								n+1, i, i, j, j, float64(served[i])/float64(qi)-float64(served[j])/float64(qj),
								maxCost[j], qj, 2+float64(maxCost[j])/float64(qj), served, cfgs)
						}
					}
				}
			}
			if d := s.Stats()[nc].Deficit; d != 0 {
				t.Fatalf("blocked class earned deficit %d", d)
			}
		})
	}
}
