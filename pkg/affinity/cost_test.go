package affinity

import (
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

func TestCost(t *testing.T) {
	cases := []struct {
		name string
		l    Load
		bs   int
		want uint64
	}{
		{"empty", Load{}, 16, 0},
		{"partial blocks round up, decode counts sequences", Load{Prefill: 17, ActivePrefill: 1, Decode: 16}, 16, 2 + 1 + 16},
		{"token units", Load{Prefill: 5, ActivePrefill: 6, Decode: 7}, 0, 18},
		{"saturates", Load{Prefill: ^uint64(0), Decode: ^uint64(0)}, 1, ^uint64(0)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.l.Cost(tc.bs); got != tc.want {
				t.Fatalf("Cost = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestRankOrder(t *testing.T) {
	cases := []struct {
		name  string
		loads []Load
		want  []int
	}{
		{"cheapest first", []Load{{Prefill: 64}, {Prefill: 16}, {Prefill: 32}}, []int{1, 2, 0}},
		{"cached overlap wins over a little load", []Load{
			{Prefill: 2048, ActivePrefill: 0},
			{Prefill: 16, ActivePrefill: 512, Decode: 16},
		}, []int{1, 0}},
		{"load beats overlap when heavy", []Load{
			{Prefill: 2048},
			{Prefill: 16, ActivePrefill: 4096},
		}, []int{0, 1}},
		{"affinity before cost, within a tier", []Load{
			{Prefill: 16, Affinity: 2},
			{Prefill: 4096, Affinity: 1},
			{Busy: true, Prefill: 16},
			{Prefill: 64, Affinity: 9}, // counts as 3
		}, []int{1, 0, 3, 2}},
		{"busy after not busy, stale last", []Load{
			{Stale: true},
			{Busy: true, Prefill: 1},
			{Prefill: 100000},
			{Stale: true, Busy: true},
		}, []int{2, 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRanker(1)
			got := r.Rank(tc.loads, 16, len(tc.want), nil)
			if !slices.Equal(got[:len(tc.want)], tc.want) {
				t.Fatalf("Rank = %v, want %v first", got, tc.want)
			}
			sorted := slices.Clone(got)
			sort.Ints(sorted)
			for i, v := range sorted {
				if v != i {
					t.Fatalf("Rank = %v: not every index once", got)
				}
			}
		})
	}
}

func TestRankTiesAreRandom(t *testing.T) {
	r := NewRanker(7)
	loads := make([]Load, 4)
	counts := make([]int, 4)
	for range 4000 {
		counts[r.Rank(loads, 16, 1, nil)[0]]++
	}
	for i, c := range counts {
		if c < 800 || c > 1200 {
			t.Errorf("equal endpoint %d picked %d of 4000 times, want about 1000: %v", i, c, counts)
		}
	}
}

// TestRankMatchesFullSort: the partial selection agrees with sorting by
// (tier, cost) on the positions it orders.
func TestRankMatchesFullSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	r := NewRanker(3)
	for trial := range 200 {
		n := 1 + rng.IntN(50)
		loads := make([]Load, n)
		for i := range loads {
			loads[i] = Load{Stale: rng.IntN(8) == 0, Busy: rng.IntN(4) == 0,
				Prefill: rng.Uint64N(100) * 16, ActivePrefill: rng.Uint64N(100) * 16, Affinity: uint8(rng.IntN(3))}
		}
		want := 1 + rng.IntN(5)
		out := r.Rank(loads, 16, want, []int{-1})
		if out[0] != -1 || len(out) != n+1 {
			t.Fatalf("trial %d: Rank did not append to out: %v", trial, out)
		}
		got := out[1:]
		key := func(i int) [2]uint64 {
			return [2]uint64{loads[i].tier()<<2 | uint64(loads[i].Affinity), loads[i].Cost(16)}
		}
		ref := make([]int, n)
		for i := range ref {
			ref[i] = i
		}
		sort.SliceStable(ref, func(a, b int) bool {
			ka, kb := key(ref[a]), key(ref[b])
			return ka[0] < kb[0] || ka[0] == kb[0] && ka[1] < kb[1]
		})
		for i := 0; i < min(want, n); i++ {
			if key(got[i]) != key(ref[i]) {
				t.Fatalf("trial %d: position %d has key %v, want %v", trial, i, key(got[i]), key(ref[i]))
			}
		}
	}
}
