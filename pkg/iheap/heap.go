package iheap

// Heap is a min-heap of items of type T ordered by a 64-bit key, then by
// less (see the package documentation). The zero Heap is not usable: make
// one with New.
type Heap[T any] struct {
	entries []entry[T]
	less    func(a, b T) bool
}

// entry is one heap slot: the key, the item, and where the item keeps its
// position (nil when it keeps none), side by side so that a comparison of
// different keys reads the slot array only and a move records the new
// position with a plain store.
type entry[T any] struct {
	key  uint64
	item T
	pos  *int32
}

// New returns an empty heap; less orders items of equal keys and must not
// be nil. It is a func value rather than a method of a type parameter:
// Go calls both indirectly from generic code, and the method, through the
// generic code's dictionary, measured slower.
func New[T any](less func(a, b T) bool) Heap[T] { return Heap[T]{less: less} }

// Len returns the number of items in the heap.
func (h *Heap[T]) Len() int { return len(h.entries) }

// At returns the item at position i; At(0) is the first item.
func (h *Heap[T]) At(i int) T { return h.entries[i].item }

// Key returns the key of the item at position i.
func (h *Heap[T]) Key(i int) uint64 { return h.entries[i].key }

// Cap returns the number of items the heap holds without growing.
func (h *Heap[T]) Cap() int { return cap(h.entries) }

// Push adds x with the given key. pos, if not nil, is the field in which
// x keeps its position for Fix and Remove: the heap stores x's position
// there whenever it changes, and -1 when x leaves.
func (h *Heap[T]) Push(key uint64, x T, pos *int32) {
	// The sift up is written out here rather than calling up: Push is the
	// most frequent call, and the loop keeps key and x in registers.
	h.entries = append(h.entries, entry[T]{key: key, item: x, pos: pos})
	s := h.entries
	n := len(s) - 1
	j := n
	for j > 0 {
		i := (j - 1) / 2
		p := &s[i]
		if key != p.key {
			if key > p.key {
				break
			}
		} else if !h.less(x, p.item) {
			break
		}
		s[j] = *p
		if p.pos != nil {
			*p.pos = int32(j)
		}
		j = i
	}
	if j != n {
		s[j] = entry[T]{key: key, item: x, pos: pos}
	}
	if pos != nil {
		*pos = int32(j)
	}
}

// Pop removes and returns the first item. The heap must not be empty.
func (h *Heap[T]) Pop() T { return h.Remove(0) }

// Remove removes and returns the item at position i.
func (h *Heap[T]) Remove(i int) T {
	s := h.entries
	n := len(s) - 1
	x, pos := s[i].item, s[i].pos
	if i == n {
		s[n] = entry[T]{} // let the item go
		h.entries = s[:n]
	} else {
		last := s[n]
		s[n] = entry[T]{}
		h.entries = s[:n]
		j := h.down(i, &last)
		if j == i && i > 0 {
			j = h.up(i, &last)
		}
		s[j] = last
		if last.pos != nil {
			*last.pos = int32(j)
		}
	}
	if pos != nil {
		*pos = -1
	}
	return x
}

// Fix restores the order after the item at position i changed; key is its
// key now.
func (h *Heap[T]) Fix(i int, key uint64) {
	e := h.entries[i]
	e.key = key
	j := h.down(i, &e)
	if j == i {
		j = h.up(i, &e)
	}
	h.entries[j] = e
	if e.pos != nil {
		*e.pos = int32(j)
	}
}

// Reset empties the heap without telling the items: the caller is done
// with them. It keeps the entry array for the next items if its capacity
// is at most keepCap, and lets it go otherwise.
func (h *Heap[T]) Reset(keepCap int) {
	if cap(h.entries) > keepCap {
		h.entries = nil
		return
	}
	clear(h.entries)
	h.entries = h.entries[:0]
}

// Compact gives back the memory of a burst: when the capacity is above
// minCap and less than a quarter of it is in use, the entries move to an
// array of twice their number. Called after each removal, its copies cost
// O(1) amortised per removal.
func (h *Heap[T]) Compact(minCap int) {
	if n, c := len(h.entries), cap(h.entries); c > minCap && n < c/4 {
		h.entries = append(make([]entry[T], 0, 2*n), h.entries...)
	}
}

// The sifts (these two and Push's) spell the order out as nested branches
// rather than calling a before(a, b) bool: the compiler then jumps on the
// key comparison directly instead of materialising a boolean and testing
// it, and the key comparison is most of a sift's work.

// up moves the hole at position j up past the ancestors e goes before and
// returns where the hole stopped: e's position. It does not store e.
func (h *Heap[T]) up(j int, e *entry[T]) int {
	s := h.entries
	for j > 0 {
		i := (j - 1) / 2
		p := &s[i]
		if e.key != p.key {
			if e.key > p.key {
				break
			}
		} else if !h.less(e.item, p.item) {
			break
		}
		s[j] = *p
		if p.pos != nil {
			*p.pos = int32(j)
		}
		j = i
	}
	return j
}

// down moves the hole at position i0 down past the children that go before
// e and returns where the hole stopped: e's position. It does not store e.
func (h *Heap[T]) down(i0 int, e *entry[T]) int {
	s := h.entries
	n := len(s)
	i := i0
	for {
		j := 2*i + 1
		if j >= n || j < 0 { // j < 0: int overflow
			break
		}
		c := &s[j]
		if r := j + 1; r < n {
			if d := &s[r]; d.key != c.key {
				if d.key < c.key {
					j, c = r, d
				}
			} else if h.less(d.item, c.item) {
				j, c = r, d
			}
		}
		if c.key != e.key {
			if c.key > e.key {
				break
			}
		} else if !h.less(c.item, e.item) {
			break
		}
		s[i] = *c
		if c.pos != nil {
			*c.pos = int32(i)
		}
		i = j
	}
	return i
}
