package drr

import (
	"math"
	"math/bits"
)

// The heaps are written by hand: container/heap would box every push and
// pop through an interface, and the hot path of Pop must not allocate.
//
// A heap slot carries a 64-bit prefix of its item's order key next to the
// pointer, so most comparisons read only the slice and never touch the
// items: with 100k queued requests, chasing two item pointers per level of
// a sift is what costs (cache misses), not the comparison itself.

// slot is one heap entry: the item and its key prefix (see hotKey).
type slot struct {
	hot uint64
	it  *Item
}

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

// ahead reports whether slot a goes before slot b.
func ahead(a, b *slot) bool {
	if a.hot != b.hot {
		return a.hot < b.hot
	}
	return before(a.it, b.it)
}

// lane is one ordered heap of a class: its shared heap, or the exact lane
// of one pinned endpoint.
type lane struct {
	items []slot
	cls   *class
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

// verdictCached reports whether the lane holds a Ready verdict taken since
// the last EndpointChanged of its endpoint.
func (l *lane) verdictCached() bool { return l.ready && l.readyGen == l.ep.gen }

// head returns the first item of a non-empty lane.
func (l *lane) head() *Item { return l.items[0].it }

func (l *lane) push(it *Item) {
	it.home = l
	it.idx = int32(len(l.items))
	l.items = append(l.items, slot{hot: hotKey(it), it: it})
	l.up(len(l.items) - 1)
}

// removeAt takes the item at position i out of the heap.
func (l *lane) removeAt(i int) {
	n := len(l.items) - 1
	if i != n {
		l.swap(i, n)
	}
	l.items[n] = slot{} // let the item go
	l.items = l.items[:n]
	if i != n {
		if !l.down(i) {
			l.up(i)
		}
	}
	// Give back the memory of a burst once the heap is mostly empty; the
	// copy is amortised over the removals that emptied it.
	if c := cap(l.items); c > shrinkMinCap && n < c/4 {
		l.items = append(make([]slot, 0, 2*n), l.items...)
	}
}

// shrinkMinCap is the heap capacity below which a heap never shrinks.
const shrinkMinCap = 1024

func (l *lane) swap(i, j int) {
	h := l.items
	h[i], h[j] = h[j], h[i]
	h[i].it.idx = int32(i)
	h[j].it.idx = int32(j)
}

func (l *lane) up(j int) {
	h := l.items
	for j > 0 {
		i := (j - 1) / 2
		if !ahead(&h[j], &h[i]) {
			break
		}
		l.swap(i, j)
		j = i
	}
}

// down sifts position i0 down and reports whether it moved.
func (l *lane) down(i0 int) bool {
	h := l.items
	n := len(h)
	i := i0
	for {
		j := 2*i + 1
		if j >= n || j < 0 {
			break
		}
		if r := j + 1; r < n && ahead(&h[r], &h[j]) {
			j = r
		}
		if !ahead(&h[j], &h[i]) {
			break
		}
		l.swap(i, j)
		i = j
	}
	return i > i0
}

// The candidate index of a class: a heap of its exact lanes that are not
// known to be blocked, ordered by their heads. Each entry repeats its
// head's key prefix so that sifts rarely dereference lanes.

// candSlot is one entry of a candidate index.
type candSlot struct {
	hot uint64 // l's head slot's hot key
	l   *lane
}

func candAhead(a, b *candSlot) bool {
	if a.hot != b.hot {
		return a.hot < b.hot
	}
	return before(a.l.items[0].it, b.l.items[0].it)
}

func (c *class) candPush(l *lane) {
	l.hidx = int32(len(c.cand))
	c.cand = append(c.cand, candSlot{hot: l.items[0].hot, l: l})
	c.candUp(len(c.cand) - 1)
}

func (c *class) candRemoveAt(i int) {
	n := len(c.cand) - 1
	if i != n {
		c.candSwap(i, n)
	}
	c.cand[n].l.hidx = -1
	c.cand[n] = candSlot{}
	c.cand = c.cand[:n]
	if i != n {
		c.candFix(i)
	}
}

// candFix restores the index after the head of the lane at i changed.
func (c *class) candFix(i int) {
	c.cand[i].hot = c.cand[i].l.items[0].hot
	if !c.candDown(i) {
		c.candUp(i)
	}
}

func (c *class) candSwap(i, j int) {
	h := c.cand
	h[i], h[j] = h[j], h[i]
	h[i].l.hidx = int32(i)
	h[j].l.hidx = int32(j)
}

func (c *class) candUp(j int) {
	h := c.cand
	for j > 0 {
		i := (j - 1) / 2
		if !candAhead(&h[j], &h[i]) {
			break
		}
		c.candSwap(i, j)
		j = i
	}
}

func (c *class) candDown(i0 int) bool {
	h := c.cand
	n := len(h)
	i := i0
	for {
		j := 2*i + 1
		if j >= n || j < 0 {
			break
		}
		if r := j + 1; r < n && candAhead(&h[r], &h[j]) {
			j = r
		}
		if !candAhead(&h[j], &h[i]) {
			break
		}
		c.candSwap(i, j)
		i = j
	}
	return i > i0
}
