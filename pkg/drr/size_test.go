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
