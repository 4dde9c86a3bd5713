package iheap

// Heap is a min-heap of items of type T ordered by a 64-bit key, then by
// less (see the package documentation). The zero Heap is not usable: make
// one with New.
type Heap[T any] struct {
	entries  []entry[T]
	less     func(a, b T) bool
	setIndex func(x T, i int)
}

// entry is one heap slot: the item and its key, side by side so that a
// comparison of different keys reads the slot array only.
type entry[T any] struct {
	key  uint64
	item T
}

// New returns an empty heap. less orders items of equal keys and must not
// be nil; setIndex, if not nil, is told every item's position as it
// changes, and -1 when the item leaves the heap.
//
// The two functions are plain fields rather than methods of a type
// parameter: Go calls a type parameter's methods through the generic
// code's dictionary, which measured slower than calling a func value.
func New[T any](less func(a, b T) bool, setIndex func(x T, i int)) Heap[T] {
	return Heap[T]{less: less, setIndex: setIndex}
}

// Len returns the number of items in the heap.
func (h *Heap[T]) Len() int { return len(h.entries) }

// At returns the item at position i; At(0) is the first item.
func (h *Heap[T]) At(i int) T { return h.entries[i].item }

// Key returns the key of the item at position i.
func (h *Heap[T]) Key(i int) uint64 { return h.entries[i].key }

// Cap returns the number of items the heap holds without growing.
func (h *Heap[T]) Cap() int { return cap(h.entries) }

// Push adds x with the given key.
func (h *Heap[T]) Push(key uint64, x T) {
	h.entries = append(h.entries, entry[T]{})
	e := entry[T]{key: key, item: x}
	h.put(h.up(len(h.entries)-1, &e), &e)
}

// Pop removes and returns the first item. The heap must not be empty.
func (h *Heap[T]) Pop() T { return h.Remove(0) }

// Remove removes and returns the item at position i.
func (h *Heap[T]) Remove(i int) T {
	s := h.entries
	n := len(s) - 1
	x := s[i].item
	last := s[n]
	s[n] = entry[T]{} // let the item go
	h.entries = s[:n]
	if i != n {
		j := h.down(i, &last)
		if j == i {
			j = h.up(i, &last)
		}
		h.put(j, &last)
	}
	if h.setIndex != nil {
		h.setIndex(x, -1)
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
	if j == i {
		h.entries[i].key = key // it stays: no position to report
		return
	}
	h.put(j, &e)
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

// before reports whether entry a goes before entry b.
func (h *Heap[T]) before(a, b *entry[T]) bool {
	if a.key != b.key {
		return a.key < b.key
	}
	return h.less(a.item, b.item)
}

// put stores e at position i and reports the position.
func (h *Heap[T]) put(i int, e *entry[T]) {
	h.entries[i] = *e
	if h.setIndex != nil {
		h.setIndex(e.item, i)
	}
}

// up moves the hole at position j up past the ancestors e goes before and
// returns where the hole stopped: e's position. It does not store e.
func (h *Heap[T]) up(j int, e *entry[T]) int {
	s := h.entries
	for j > 0 {
		i := (j - 1) / 2
		if !h.before(e, &s[i]) {
			break
		}
		s[j] = s[i]
		if h.setIndex != nil {
			h.setIndex(s[j].item, j)
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
		if r := j + 1; r < n && h.before(&s[r], &s[j]) {
			j = r
		}
		if !h.before(&s[j], e) {
			break
		}
		s[i] = s[j]
		if h.setIndex != nil {
			h.setIndex(s[i].item, i)
		}
		i = j
	}
	return i
}
