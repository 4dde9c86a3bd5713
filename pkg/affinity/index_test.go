package affinity

import (
	"math/bits"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/pkg/tokenize"
)

// isGrid is the stored-position rule spelled out directly.
func isGrid(p int) bool {
	if p < denseBlocks {
		return true
	}
	step := 1 << (bits.Len(uint(p)) - denseBits)
	return p%step == 0
}

func TestGridFunctionsAgreeWithTheRule(t *testing.T) {
	count := 0
	for p := 0; p < 1<<16; p++ {
		if gridCount(p) != count {
			t.Fatalf("gridCount(%d) = %d, want %d", p, gridCount(p), count)
		}
		if isGrid(p) {
			if gridPos(count) != p {
				t.Fatalf("gridPos(%d) = %d, want %d", count, gridPos(count), p)
			}
			count++
		}
		want := p
		for !isGrid(want) {
			want--
		}
		if got := gridAtOrBelow(p); got != want {
			t.Fatalf("gridAtOrBelow(%d) = %d, want %d", p, got, want)
		}
	}
	if got := gridCount(2048); got != 224 {
		t.Errorf("a 2048-block prompt has %d grid positions, want 224", got)
	}
}

// prompt returns block hashes of a prompt of n blocks whose first shared
// blocks equal those of every other prompt built with the same base, and
// whose rest is unique to seed.
func prompt(n, shared int, base, seed uint32) []uint64 {
	const bs = 16
	toks := make([]uint32, n*bs)
	for i := range toks {
		if i < shared*bs {
			toks[i] = base*100003 + uint32(i)
		} else {
			toks[i] = seed*7919 + uint32(i)*31 + 1<<30
		}
	}
	return tokenize.BlockHashes(toks, bs)
}

func TestOverlap(t *testing.T) {
	now := int64(time.Hour)
	cases := []struct {
		name       string
		recorded   []int // blocks of the recorded prompt (shares everything with base 1)
		queryN     int
		queryShare int
		want       int
		slack      int // allowed rounding down
	}{
		{"nothing recorded", nil, 10, 10, 0, 0},
		{"same prompt short", []int{10}, 10, 10, 10, 0},
		{"same prompt long", []int{2048}, 2048, 2048, 2048, 0},
		{"longer query shares all of a short record", []int{40}, 100, 100, 40, 0},
		{"shorter query inside a long record", []int{2048}, 700, 700, 700, 700 / 32},
		{"dense region exact", []int{500}, 500, 37, 37, 0},
		{"sparse region within 1/32", []int{2048}, 2048, 1500, 1500, 1500 / 32},
		{"first block differs", []int{100}, 100, 0, 0, 0},
		{"two records, best one counts", []int{300, 900}, 2000, 2000, 900, 900 / 32},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			x := NewIndex(IndexOptions{})
			for i, n := range tc.recorded {
				x.Record(3, prompt(n, n, 1, uint32(i)), 16, now)
			}
			q := prompt(tc.queryN, tc.queryShare, 1, 99)
			got := x.Overlap(3, q, now)
			if got > tc.want || got < tc.want-tc.slack {
				t.Fatalf("Overlap = %d, want %d (rounding down by at most %d)", got, tc.want, tc.slack)
			}
			if other := x.Overlap(4, q, now); other != 0 {
				t.Errorf("another slot overlaps %d, want 0", other)
			}
		})
	}
}

func TestCapacityEvictsOldestTailFirst(t *testing.T) {
	// Capacity for 150 blocks: two 100-block prompts do not fit.
	x := NewIndex(IndexOptions{DefaultCapacity: 150 * 16})
	a := prompt(100, 100, 1, 1)
	b := prompt(100, 100, 2, 2)
	x.Record(0, a, 16, 1)
	x.Record(0, b, 16, 2)
	if got := x.Overlap(0, b, 2); got != 100 {
		t.Fatalf("newest prompt overlap %d, want 100", got)
	}
	// a lost its tail first: what is left of it is still a prefix.
	got := x.Overlap(0, a, 2)
	if got == 0 || got >= 100 {
		t.Fatalf("oldest prompt overlap %d, want a partial prefix (tail evicted first)", got)
	}
	if st := x.Stats(0); st.Tokens > 150*16 {
		t.Fatalf("index holds %d tokens, capacity %d", st.Tokens, 150*16)
	}
	// Touching a again makes b the older one.
	x.Record(0, a, 16, 3)
	if got := x.Overlap(0, a, 3); got != 100 {
		t.Fatalf("refreshed prompt overlap %d, want 100", got)
	}
	if got := x.Overlap(0, b, 3); got >= 100 {
		t.Fatalf("older prompt overlap %d, want < 100 after the refresh of the other", got)
	}
}

func TestSharedPrefixSurvivesWhileUsed(t *testing.T) {
	// A popular 50-block prefix with ever new suffixes, in a cache of 200
	// blocks: the prefix is refreshed by every prompt and never evicted.
	x := NewIndex(IndexOptions{DefaultCapacity: 200 * 16})
	for i := range 200 {
		x.Record(0, prompt(80, 50, 7, uint32(i)), 16, int64(i))
	}
	if got := x.Overlap(0, prompt(80, 50, 7, 9999), 200); got != 50 {
		t.Fatalf("popular prefix overlap %d, want 50", got)
	}
	st := x.Stats(0)
	if st.Tokens > 200*16 {
		t.Fatalf("index over capacity: %+v", st)
	}
	e := x.eps[0]
	if q := len(e.ring) - e.head; q > 2*len(e.m)+1024 {
		t.Fatalf("eviction queue %d records for %d entries: superseded records are not compacted", q, len(e.m))
	}
}

func TestTTLAndMaxEntries(t *testing.T) {
	x := NewIndex(IndexOptions{TTL: time.Minute})
	p := prompt(20, 20, 1, 1)
	x.Record(0, p, 16, 0)
	if got := x.Overlap(0, p, int64(time.Minute)); got != 20 {
		t.Fatalf("overlap at the TTL %d, want 20", got)
	}
	if got := x.Overlap(0, p, int64(time.Minute)+1); got != 0 {
		t.Fatalf("overlap past the TTL %d, want 0", got)
	}
	// Expired entries leave at the next Record.
	x.Record(0, prompt(5, 5, 2, 2), 16, int64(2*time.Minute))
	if st := x.Stats(0); st.Entries != 5 {
		t.Fatalf("entries after expiry %d, want the 5 new ones", st.Entries)
	}

	y := NewIndex(IndexOptions{MaxEntries: 30})
	y.Record(1, prompt(40, 40, 1, 1), 16, 0)
	if st := y.Stats(1); st.Entries != 30 {
		t.Fatalf("entries %d, want MaxEntries 30", st.Entries)
	}
	if got := y.Overlap(1, prompt(40, 40, 1, 1), 0); got != 30 {
		t.Fatalf("overlap after the entry bound %d, want the first 30 blocks", got)
	}
}

func TestSetCapacityDropAndBadInput(t *testing.T) {
	x := NewIndex(IndexOptions{})
	p := prompt(100, 100, 1, 1)
	x.Record(2, p, 16, 0)
	x.SetCapacity(2, 10*16)
	x.Record(2, prompt(1, 1, 9, 9), 16, 1)
	if st := x.Stats(2); st.Tokens > 10*16 {
		t.Fatalf("after SetCapacity(160 tokens) the index holds %+v", st)
	}
	x.SetCapacity(2, 0)
	if x.eps[2].cap != DefaultCapacityTokens {
		t.Errorf("SetCapacity(0) = %d, want the default", x.eps[2].cap)
	}
	x.Drop(2)
	x.Drop(99)
	x.Drop(-1)
	if got := x.Overlap(2, p, 1); got != 0 {
		t.Fatalf("overlap after Drop %d", got)
	}
	x.Record(-1, p, 16, 0)
	x.Record(5, nil, 16, 0)
	x.Record(5, p, 0, 0)
	if x.Overlap(-1, p, 0) != 0 || x.Overlap(5, p, 0) != 0 || x.Overlap(5, nil, 0) != 0 {
		t.Error("bad input recorded something")
	}
}

// TestGridStrideWalksTheGrid: stepping by GridStride from 0 visits the
// grid positions, in order, and OnGrid holds exactly there.
func TestGridStrideWalksTheGrid(t *testing.T) {
	i, next := 0, 0
	for p := 0; p < 1<<16; p++ {
		on := p == next
		if OnGrid(p) != on || isGrid(p) != on {
			t.Fatalf("position %d: OnGrid %v, the rule %v, the walk %v", p, OnGrid(p), isGrid(p), on)
		}
		if on {
			if gridPos(i) != p {
				t.Fatalf("walk reached %d as grid position %d, gridPos says %d", p, i, gridPos(i))
			}
			i++
			next = p + GridStride(p)
		}
	}
}
