package drr

import (
	"math"
	"math/bits"

	"github.com/laneway-dev/laneway/pkg/iheap"
)

// The package's three heaps (the items of a lane, the candidate index of a
// class, the tenant ring of a tenant-fair class) are iheap.Heaps: generic,
// so no push or pop boxes through an interface (container/heap would, and
// the hot path of Pop must not allocate), and intrusive: items, lanes and
// tenants keep their position (idx, hidx, tidx), which the heap stores
// directly, for Remove and a changed head.
//
// Every heap entry carries a 64-bit prefix of its item's order key next to
// the pointer, so most comparisons read only the entry array and never
// touch the items: with 100k queued requests, chasing two item pointers
// per level of a sift is what costs (cache misses), not the comparison
// itself. The full order (before, candLess, tenLess) is consulted on equal
// prefixes only.

// hotKey returns a prefix of the order key: hotKey(a) < hotKey(b) implies
// a goes before b, and equal prefixes fall back to the full comparison. It
// packs the strict tier (4 bits; tiers >= 15 share the prefix 0 and are
// left to the full comparison), the no-deadline bit, then 59 bits of the
// deadline or the policy key, coarsened monotonically.
func hotKey(it *Item) uint64 {
	if it.strict >= 15 {
		return 0
	}
	hot := uint64(15-it.strict) << 60
	var v uint64
	switch {
	case it.hasDue:
		v = uint64(it.due) ^ (1 << 63) // signed to unsigned order
	case it.policy == WSPT:
		hot |= 1 << 59
		// cost/weight ascending is weight/cost descending: floor of
		// cost·2^32/weight, saturated (both steps keep the order).
		hi, lo := it.cost>>32, it.cost<<32
		if w := uint64(it.pk); hi >= w {
			v = math.MaxUint64
		} else {
			v, _ = bits.Div64(hi, lo, w)
		}
	default:
		hot |= 1 << 59
		v = uint64(it.pk) ^ (1 << 63)
	}
	return hot | v>>5
}

// lane is one ordered heap of a class: its shared heap, a tenant's
// sub-queue, or the exact lane of one pinned endpoint.
type lane struct {
	h   iheap.Heap[*Item]
	cls *class
	// ep is the endpoint of an exact lane; nil for the shared heap.
	ep *epState
	// hidx is the lane's position in cls.cand, or -1 when it is not there
	// (shared heap, or parked because blocked).
	hidx int32
	// pidx is the lane's position in ep.parked, or -1 when not parked.
	pidx int32
	// ready caches a Ready verdict, valid while readyGen == ep.gen.
	ready    bool
	readyGen uint64
}

// epState is what the scheduler keeps per pinned endpoint: a generation
// that EndpointChanged bumps (so cached Ready verdicts go stale) and the
// blocked lanes waiting for that endpoint, in every class.
type epState struct {
	id     EndpointID
	gen    uint64
	refs   int // exact lanes of any class on this endpoint
	parked []*lane
}

// newItemHeap returns an empty heap of items by hotKey, then before. Each
// item keeps its position in idx (push hands the heap &it.idx).
func newItemHeap() iheap.Heap[*Item] { return iheap.New(before) }

// verdictCached reports whether the lane holds a Ready verdict taken since
// the last EndpointChanged of its endpoint.
func (l *lane) verdictCached() bool { return l.ready && l.readyGen == l.ep.gen }

// len returns the number of items in the lane.
func (l *lane) len() int { return l.h.Len() }

// head returns the first item of a non-empty lane.
func (l *lane) head() *Item { return l.h.At(0) }

// appendItems appends the lane's items to out, in heap order.
func (l *lane) appendItems(out []*Item) []*Item {
	for i := range l.h.Len() {
		out = append(out, l.h.At(i))
	}
	return out
}

func (l *lane) push(it *Item) {
	it.home = l
	l.h.Push(hotKey(it), it, &it.idx)
}

// removeAt takes the item at position i out of the heap.
func (l *lane) removeAt(i int) {
	l.h.Remove(i)
	// Give back the memory of a burst once the heap is mostly empty.
	l.h.Compact(shrinkMinCap)
}

// shrinkMinCap is the heap capacity below which a heap never shrinks.
const shrinkMinCap = 1024

// The candidate index of a class: a heap of its exact lanes that are not
// known to be blocked, ordered by their heads. Each entry's key is its
// head's key prefix, so that sifts rarely dereference lanes.

func newCandHeap() iheap.Heap[*lane] { return iheap.New(candLess) }

func candLess(a, b *lane) bool { return before(a.head(), b.head()) }

func (c *class) candPush(l *lane) { c.cand.Push(l.h.Key(0), l, &l.hidx) }

func (c *class) candRemoveAt(i int) { c.cand.Remove(i) }

// candFix restores the index after the head of the lane at i changed.
func (c *class) candFix(i int) { c.cand.Fix(i, c.cand.At(i).h.Key(0)) }
