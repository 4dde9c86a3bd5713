package drr

import (
	"testing"
	"unsafe"
)

// TestItemSize guards the per-request memory budget: an Item must fit the
// 144-byte malloc size class (payload excluded).
func TestItemSize(t *testing.T) {
	if got := unsafe.Sizeof(Item{}); got > 144 {
		t.Fatalf("Item is %d bytes; want <= 144", got)
	}
}

// TestHeapShrinksAfterBurst: a burst's heap memory is given back once the
// queue has drained, and the order survives the copy.
func TestHeapShrinksAfterBurst(t *testing.T) {
	s := mustNew(t, qclass("c", 1<<40, FCFS))
	for i := 0; i < 10_000; i++ {
		enqueue(t, s, Request{Pinned: NoEndpoint, RawISL: 1, Arrival: int64(10_000 - i)})
	}
	last := int64(-1)
	for i := 0; i < 9_990; i++ {
		it, out := s.Pop(0, newProbe())
		if out != Dispatch || it.Arrival <= last {
			t.Fatalf("pop %d: %v arrival %d after %d", i, out, it.Arrival, last)
		}
		last = it.Arrival
	}
	if c := s.classes[0].shared.h.Cap(); c > shrinkMinCap {
		t.Fatalf("heap capacity %d with %d queued; want <= %d", c, s.Len(), shrinkMinCap)
	}
}
