package iheap_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/laneway-dev/laneway/pkg/iheap"
	"github.com/laneway-dev/laneway/pkg/iheap/iheaptest"
)

// elem is a test item that records its position.
type elem struct {
	id, rank int
	idx      int32
}

// elemKey is a coarse prefix of the order, so that near ranks share a key
// and less breaks the tie.
func elemKey(rank int) uint64 { return uint64(rank) >> 2 }

func elemLess(a, b *elem) bool {
	if a.rank != b.rank {
		return a.rank < b.rank
	}
	return a.id < b.id
}

// plain adapts a bare Heap of *elem whose items keep no position.
type plain struct {
	h     iheap.Heap[*elem]
	elems map[int]*elem
}

func (p *plain) Push(id, rank int) {
	e := &elem{id: id, rank: rank, idx: -1}
	p.elems[id] = e
	p.h.Push(elemKey(rank), e, nil)
}
func (p *plain) Pop() int     { return p.h.Pop().id }
func (p *plain) Len() int     { return p.h.Len() }
func (p *plain) At(i int) int { return p.h.At(i).id }

// positioned is plain with items that keep their position.
type positioned struct{ plain }

func (p *positioned) Push(id, rank int) {
	e := &elem{id: id, rank: rank, idx: -1}
	p.elems[id] = e
	p.h.Push(elemKey(rank), e, &e.idx)
}
func (p *positioned) Index(id int) int { return int(p.elems[id].idx) }
func (p *positioned) Fix(id, rank int) {
	e := p.elems[id]
	e.rank = rank
	p.h.Fix(int(e.idx), elemKey(rank))
}
func (p *positioned) Remove(id int) { p.h.Remove(int(p.elems[id].idx)) }

func TestConformance(t *testing.T) {
	t.Run("positions", func(t *testing.T) {
		iheaptest.Run(t, func(*testing.T) iheaptest.Adapter {
			return &positioned{plain{h: iheap.New(elemLess), elems: map[int]*elem{}}}
		})
	})
	t.Run("no positions", func(t *testing.T) {
		iheaptest.Run(t, func(*testing.T) iheaptest.Adapter {
			return &plain{h: iheap.New(elemLess), elems: map[int]*elem{}}
		})
	})
}

// TestKeyOrdersFirst: less is consulted only between equal keys, so a key
// that disagrees with less wins (the caller's promise is what makes the
// order right).
func TestKeyOrdersFirst(t *testing.T) {
	calls := 0
	h := iheap.New(func(a, b int) bool { calls++; return a > b }) // less: descending
	for i, k := range []uint64{3, 1, 2, 1, 3, 2} {
		h.Push(k, i, nil)
	}
	var got []int
	for h.Len() > 0 {
		got = append(got, h.Pop())
	}
	// keys ascending; equal keys by descending item
	if want := []int{3, 1, 5, 2, 4, 0}; !slices.Equal(got, want) {
		t.Fatalf("pop order %v; want %v", got, want)
	}
	if calls == 0 {
		t.Fatal("less never called on equal keys")
	}
}

// TestSameLayoutAsSwapSifts: after pushes, pops, fixes and removals the
// hole-moving sifts leave every entry where container/heap-style swaps
// would, so ties less leaves open (all of them here: less says "not
// before" both ways) break the same way.
func TestSameLayoutAsSwapSifts(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	h := iheap.New(func(a, b int) bool { return false })
	var ref swapHeap
	for step := range 5000 {
		switch k := rng.IntN(5); {
		case k < 2 || ref.len() == 0:
			key := uint64(rng.IntN(8))
			h.Push(key, step, nil)
			ref.push(key, step)
		case k == 2:
			if got, want := h.Pop(), ref.remove(0); got != want {
				t.Fatalf("step %d: Pop = %d; swap heap pops %d", step, got, want)
			}
		case k == 3:
			i, key := rng.IntN(ref.len()), uint64(rng.IntN(8))
			h.Fix(i, key)
			ref.fix(i, key)
		default:
			i := rng.IntN(ref.len())
			if got, want := h.Remove(i), ref.remove(i); got != want {
				t.Fatalf("step %d: Remove(%d) = %d; swap heap removes %d", step, i, got, want)
			}
		}
		for i := range ref.len() {
			if h.At(i) != ref.items[i] || h.Key(i) != ref.keys[i] {
				t.Fatalf("step %d: position %d holds %d (key %d); swap heap %d (key %d)", step, i, h.At(i), h.Key(i), ref.items[i], ref.keys[i])
			}
		}
	}
}

// swapHeap is the classic swap-based binary heap on keys alone.
type swapHeap struct {
	keys  []uint64
	items []int
}

func (s *swapHeap) len() int { return len(s.keys) }
func (s *swapHeap) swap(i, j int) {
	s.keys[i], s.keys[j] = s.keys[j], s.keys[i]
	s.items[i], s.items[j] = s.items[j], s.items[i]
}
func (s *swapHeap) push(k uint64, x int) {
	s.keys, s.items = append(s.keys, k), append(s.items, x)
	s.up(s.len() - 1)
}
func (s *swapHeap) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if s.keys[j] >= s.keys[i] {
			break
		}
		s.swap(i, j)
		j = i
	}
}
func (s *swapHeap) down(i0 int) bool {
	i, n := i0, s.len()
	for {
		j := 2*i + 1
		if j >= n {
			break
		}
		if r := j + 1; r < n && s.keys[r] < s.keys[j] {
			j = r
		}
		if s.keys[j] >= s.keys[i] {
			break
		}
		s.swap(i, j)
		i = j
	}
	return i > i0
}
func (s *swapHeap) fix(i int, k uint64) {
	s.keys[i] = k
	if !s.down(i) {
		s.up(i)
	}
}
func (s *swapHeap) remove(i int) int {
	n := s.len() - 1
	x := s.items[i]
	if i != n {
		s.swap(i, n)
	}
	s.keys, s.items = s.keys[:n], s.items[:n]
	if i != n && !s.down(i) {
		s.up(i)
	}
	return x
}

func TestResetAndCompact(t *testing.T) {
	h := iheap.New(func(a, b int) bool { return a < b })
	for i := range 4096 {
		h.Push(uint64(i), i, nil)
	}
	for range 4096 - 100 {
		h.Pop()
		h.Compact(1024)
	}
	if h.Cap() > 1024 {
		t.Fatalf("Cap = %d with %d left; want <= 1024 after Compact", h.Cap(), h.Len())
	}
	for i := range h.Len() {
		if h.At(i) < 4096-100 {
			t.Fatalf("position %d holds %d, popped already", i, h.At(i))
		}
	}
	if got := h.Pop(); got != 4096-100 {
		t.Fatalf("Pop after Compact = %d; want %d", got, 4096-100)
	}
	h.Reset(8)
	if h.Len() != 0 || h.Cap() != 0 {
		t.Fatalf("Reset(8) of a large heap: Len %d Cap %d; want 0, 0", h.Len(), h.Cap())
	}
	h.Push(1, 1, nil)
	h.Push(0, 0, nil)
	c := h.Cap()
	h.Reset(8)
	if h.Len() != 0 || h.Cap() != c {
		t.Fatalf("Reset(8) of a small heap: Len %d Cap %d; want 0, %d", h.Len(), h.Cap(), c)
	}
}

// TestNoAllocs: once the entry array has grown, pushes, pops, fixes and
// removals allocate nothing.
func TestNoAllocs(t *testing.T) {
	elems := make([]elem, 1000)
	h := iheap.New(elemLess)
	for i := range elems {
		elems[i] = elem{id: i, rank: i % 97}
		h.Push(elemKey(elems[i].rank), &elems[i], &elems[i].idx)
	}
	n := 0
	allocs := testing.AllocsPerRun(100, func() {
		e := h.Pop()
		e.rank = (e.rank + 31) % 97
		h.Push(elemKey(e.rank), e, &e.idx)
		x := &elems[n%len(elems)]
		n++
		x.rank = (x.rank + 7) % 97
		h.Fix(int(x.idx), elemKey(x.rank))
		y := h.Remove(h.Len() / 2)
		h.Push(elemKey(y.rank), y, &y.idx)
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per run; want 0", allocs)
	}
}

// BenchmarkPushPop is one Pop and one Push on a heap of n items that know
// their position, the shape of the DRR lanes' use.
func BenchmarkPushPop(b *testing.B) {
	for _, n := range []int{1_000, 100_000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(3, 4))
			elems := make([]elem, n)
			h := iheap.New(elemLess)
			for i := range elems {
				elems[i] = elem{id: i, rank: rng.IntN(1 << 30)}
				h.Push(elemKey(elems[i].rank), &elems[i], &elems[i].idx)
			}
			b.ReportAllocs()
			for b.Loop() {
				e := h.Pop()
				e.rank += rng.IntN(1 << 20)
				h.Push(elemKey(e.rank), e, &e.idx)
			}
		})
	}
}
