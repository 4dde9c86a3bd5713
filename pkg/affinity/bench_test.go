package affinity

import (
	"fmt"
	"testing"
)

// A 32k-token prompt in 16-token blocks.
const benchBlocks = 32768 / 16

// BenchmarkOverlap32kTokens100Endpoints: the overlap of a 32k-token prompt
// on each of 100 endpoints. "one-holder": one endpoint has the prompt (the
// usual case once prefixes concentrate); "all-hold": every endpoint has a
// different-length prefix of it (the worst case: a binary search on each).
func BenchmarkOverlap32kTokens100Endpoints(b *testing.B) {
	q := prompt(benchBlocks, benchBlocks, 1, 1)
	for _, holders := range []int{1, 100} {
		name := "one-holder"
		if holders > 1 {
			name = "all-hold"
		}
		b.Run(name, func(b *testing.B) {
			x := NewIndex(IndexOptions{})
			for s := range 100 {
				x.Record(s, prompt(64, 64, uint32(1000+s), 1), 16, 0) // unrelated entries
				if s < holders {
					n := benchBlocks * (s + 1) / 100
					x.Record(s, q[:n], 16, 0)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			sum := 0
			for b.Loop() {
				for s := range 100 {
					sum += x.Overlap(s, q, 0)
				}
			}
			if sum == 0 {
				b.Fatal("no overlap found")
			}
		})
	}
}

// BenchmarkRecord32kTokens: noting a 32k-token prompt on an endpoint, new
// and already present (refresh).
func BenchmarkRecord32kTokens(b *testing.B) {
	q := prompt(benchBlocks, benchBlocks, 1, 1)
	b.Run("refresh", func(b *testing.B) {
		x := NewIndex(IndexOptions{})
		x.Record(0, q, 16, 0)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; b.Loop(); i++ {
			x.Record(0, q, 16, int64(i))
		}
	})
	b.Run("new-prompts", func(b *testing.B) {
		prompts := make([][]uint64, 64)
		for i := range prompts {
			prompts[i] = prompt(benchBlocks, 0, 0, uint32(i))
		}
		x := NewIndex(IndexOptions{})
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; b.Loop(); i++ {
			x.Record(0, prompts[i%len(prompts)], 16, int64(i))
		}
	})
}

// BenchmarkRank: ordering 1,000 (and 100) candidates with a pick and two
// fallbacks.
func BenchmarkRank(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			loads := make([]Load, n)
			for i := range loads {
				loads[i] = Load{Prefill: uint64(32768 - (i%7)*1024), ActivePrefill: uint64(i%13) * 512, Decode: uint64(i%5) * 4096, Busy: i%11 == 0}
			}
			r := NewRanker(1)
			out := make([]int, 0, n)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				out = r.Rank(loads, 16, 3, out[:0])
			}
		})
	}
}
