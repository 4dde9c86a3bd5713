package iheaptest

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// Adapter is one heap user's wrapper as the suite sees it. Elements are
// named by ids 0, 1, 2, ... in the order they are first pushed; each has a
// rank in [0, MaxRank]. The wrapper must order elements by rank, then by
// id (the id standing for the user's own last tie breaker: an arrival
// sequence, a ring position), whatever it builds from them.
type Adapter interface {
	// Push adds element id with the given rank. id is new.
	Push(id, rank int)
	// Pop removes the first element and returns its id.
	Pop() int
	// Len returns the number of elements in the heap.
	Len() int
	// At returns the id of the element at heap position i.
	At(i int) int
}

// Positioned is an Adapter whose elements know their position in the heap
// (the user pushes them with their position field).
type Positioned interface {
	Adapter
	// Index returns the position element id has recorded: -1 once it
	// left the heap.
	Index(id int) int
	// Fix gives the queued element id a new rank and restores the order
	// through its recorded position.
	Fix(id, rank int)
	// Remove takes the queued element id out through its recorded
	// position.
	Remove(id int)
}

// MaxRank is the largest rank the suite uses. Ranks repeat on purpose:
// ties are broken by id, which is where a key prefix hands over to the
// user's less function.
const MaxRank = 40

// opKind is one step of a case.
type opKind uint8

const (
	opPush   opKind = iota // push a new element (rank r)
	opPop                  // pop the first element
	opFix                  // give the element at position a rank r
	opRemove               // remove the element at position a
)

// op is one step: for opFix and opRemove, at is a heap position (taken
// modulo the length), so a case names "the root" or "the last" without
// knowing ids.
type op struct {
	kind opKind
	at   int
	rank int
}

func push(ranks ...int) []op {
	ops := make([]op, len(ranks))
	for i, r := range ranks {
		ops[i] = op{kind: opPush, rank: r}
	}
	return ops
}

func pops(n int) []op {
	ops := make([]op, n)
	for i := range ops {
		ops[i] = op{kind: opPop}
	}
	return ops
}

func seq(parts ...[]op) []op {
	var ops []op
	for _, p := range parts {
		ops = append(ops, p...)
	}
	return ops
}

const last = -1 // position: the last one

// cases is the suite's table.
var cases = []struct {
	name string
	ops  []op
}{
	{"push ascending, pop all", seq(push(0, 1, 2, 3, 4, 5, 6, 7, 8, 9), pops(10))},
	{"push descending, pop all", seq(push(9, 8, 7, 6, 5, 4, 3, 2, 1, 0), pops(10))},
	{"equal ranks pop by id", seq(push(5, 5, 5, 5, 5, 5, 5), pops(7))},
	{"near ranks share key prefixes", seq(push(3, 1, 2, 1, 3, 2, 0, 0, 1), pops(9))},
	{"pop from one element", seq(push(7), pops(1), push(3, 2), pops(2))},
	{"interleaved push and pop", seq(push(4, 2), pops(1), push(1, 3, 0), pops(2), push(9, 9, 2), pops(4))},
	{"fix the root down", seq(push(0, 3, 5, 7, 9, 11, 13), []op{{kind: opFix, at: 0, rank: MaxRank}}, pops(7))},
	{"fix the last up", seq(push(10, 12, 14, 16, 18, 20, 22), []op{{kind: opFix, at: last, rank: 0}}, pops(7))},
	{"fix to the same rank", seq(push(4, 8, 6, 2), []op{{kind: opFix, at: 1, rank: -1}}, pops(4))},
	{"fix into a tie", seq(push(1, 2, 3, 4, 5, 6), []op{{kind: opFix, at: 4, rank: 1}, {kind: opFix, at: 0, rank: 6}}, pops(6))},
	{"remove the root", seq(push(3, 1, 4, 1, 5, 9, 2, 6), []op{{kind: opRemove, at: 0}}, pops(7))},
	{"remove the last", seq(push(3, 1, 4, 1, 5, 9, 2, 6), []op{{kind: opRemove, at: last}}, pops(7))},
	{"remove in the middle, the filler goes up", seq(push(0, 20, 1, 21, 22, 2, 3), []op{{kind: opRemove, at: 3}}, pops(6))},
	{"remove in the middle, the filler goes down", seq(push(0, 5, 1, 6, 7, 2, 3, 9), []op{{kind: opRemove, at: 1}}, pops(7))},
	{"remove everything", seq(push(5, 4, 3), []op{{kind: opRemove, at: 1}, {kind: opRemove, at: 0}, {kind: opRemove, at: 0}}, push(2), pops(1))},
	{"random", randomOps(2000)},
}

// randomOps is a long mixed sequence from a fixed seed, biased to grow so
// the heap gets a few levels deep.
func randomOps(n int) []op {
	rng := rand.New(rand.NewPCG(20, 5))
	ops := make([]op, n)
	for i := range ops {
		switch k := rng.IntN(10); {
		case k < 5:
			ops[i] = op{kind: opPush, rank: rng.IntN(MaxRank + 1)}
		case k < 7:
			ops[i] = op{kind: opPop}
		case k < 9:
			ops[i] = op{kind: opFix, at: rng.IntN(1 << 10), rank: rng.IntN(MaxRank + 1)}
		default:
			ops[i] = op{kind: opRemove, at: rng.IntN(1 << 10)}
		}
	}
	return ops
}

// Run runs the suite: every case of the table against a new adapter from
// newAdapter. Steps that need positions (Fix, Remove) are skipped for an
// adapter that is not Positioned; a pop or a fix on an empty heap is
// skipped for all.
func Run(t *testing.T, newAdapter func(t *testing.T) Adapter) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := newAdapter(t)
			m := &model{rank: map[int]int{}, queued: map[int]bool{}}
			for step, o := range tc.ops {
				if err := m.apply(a, o); err != nil {
					t.Fatalf("step %d (%v): %v", step, o, err)
				}
				if err := m.check(a); err != nil {
					t.Fatalf("after step %d (%v): %v", step, o, err)
				}
			}
		})
	}
}

// model is what the heap should hold: each id's rank, and which ids are
// queued.
type model struct {
	rank   map[int]int
	queued map[int]bool
	next   int // the next new id
}

// first reports whether element a goes before element b.
func (m *model) first(a, b int) bool {
	if m.rank[a] != m.rank[b] {
		return m.rank[a] < m.rank[b]
	}
	return a < b
}

func (m *model) min() int {
	best := -1
	for id := range m.queued {
		if best < 0 || m.first(id, best) {
			best = id
		}
	}
	return best
}

// apply runs one step on the adapter and on the model.
func (m *model) apply(a Adapter, o op) error {
	p, positioned := a.(Positioned)
	n := len(m.queued)
	pos := func() int {
		if o.at == last {
			return n - 1
		}
		return o.at % n
	}
	switch o.kind {
	case opPush:
		id := m.next
		m.next++
		m.rank[id], m.queued[id] = o.rank, true
		a.Push(id, o.rank)
	case opPop:
		if n == 0 {
			return nil
		}
		want := m.min()
		if got := a.Pop(); got != want {
			return fmt.Errorf("popped %d (rank %d); want %d (rank %d)", got, m.rank[got], want, m.rank[want])
		}
		delete(m.queued, want)
		if positioned {
			if i := p.Index(want); i != -1 {
				return fmt.Errorf("popped element %d records position %d; want -1", want, i)
			}
		}
	case opFix:
		if !positioned || n == 0 {
			return nil
		}
		id := a.At(pos())
		r := o.rank
		if r < 0 {
			r = m.rank[id] // the same rank again
		}
		m.rank[id] = r
		p.Fix(id, r)
	case opRemove:
		if !positioned || n == 0 {
			return nil
		}
		id := a.At(pos())
		p.Remove(id)
		delete(m.queued, id)
		if i := p.Index(id); i != -1 {
			return fmt.Errorf("removed element %d records position %d; want -1", id, i)
		}
	}
	return nil
}

// check compares the adapter's heap with the model: the same elements,
// the heap property, and every recorded position.
func (m *model) check(a Adapter) error {
	if got, want := a.Len(), len(m.queued); got != want {
		return fmt.Errorf("length %d; want %d", got, want)
	}
	seen := make(map[int]bool, len(m.queued))
	for i := range a.Len() {
		id := a.At(i)
		if !m.queued[id] || seen[id] {
			return fmt.Errorf("position %d holds element %d, which is not queued or is there twice", i, id)
		}
		seen[id] = true
		if parent := (i - 1) / 2; i > 0 && m.first(id, a.At(parent)) {
			return fmt.Errorf("heap property: element %d (rank %d) at %d goes before its parent %d (rank %d) at %d",
				id, m.rank[id], i, a.At(parent), m.rank[a.At(parent)], parent)
		}
		if p, ok := a.(Positioned); ok {
			if got := p.Index(id); got != i {
				return fmt.Errorf("element %d is at %d but records %d", id, i, got)
			}
		}
	}
	return nil
}

func (o op) String() string {
	switch o.kind {
	case opPush:
		return fmt.Sprintf("push rank %d", o.rank)
	case opPop:
		return "pop"
	case opFix:
		return fmt.Sprintf("fix position %d to rank %d", o.at, o.rank)
	default:
		return fmt.Sprintf("remove position %d", o.at)
	}
}
