package drr

import (
	"testing"

	"github.com/laneway-dev/laneway/pkg/iheap/iheaptest"
)

// TestHeapConformance runs iheap's conformance suite against the three
// heaps of the package, through their own wrappers: a lane's items, a
// class's candidate index of lanes, and a tenant-fair class's tenant ring.
// Ranks map to strict tiers 13..18 (across hotKey's and tenKey's 4-bit
// cap) and, within a tier, to policy keys eight apart or rounds one apart
// that start again at every tier (so a key that let them outrank the tier
// would fail), and near ranks share key prefixes so that the full orders
// break the ties.
func TestHeapConformance(t *testing.T) {
	t.Run("lane", func(t *testing.T) {
		iheaptest.Run(t, func(*testing.T) iheaptest.Adapter {
			return &laneAdapter{l: &lane{h: newItemHeap(), hidx: -1, pidx: -1}, items: map[int]*Item{}}
		})
	})
	t.Run("candidate index", func(t *testing.T) {
		iheaptest.Run(t, func(*testing.T) iheaptest.Adapter {
			return &candAdapter{c: &class{cand: newCandHeap()}, lanes: map[int]*lane{}}
		})
	})
	t.Run("tenant ring", func(t *testing.T) {
		iheaptest.Run(t, func(*testing.T) iheaptest.Adapter {
			return &tenantAdapter{c: &class{tq: newTenantHeap()}, tenants: map[int]*tenant{}}
		})
	})
}

// rankTier is the strict tier of a rank: higher for lower ranks, one tier
// per eight ranks.
func rankTier(rank int) uint32 { return 13 + uint32(iheaptest.MaxRank/8-rank/8) }

// setRank orders an fcfs item by rank, with id as its arrival sequence.
func setRank(it *Item, id, rank int) {
	it.strict, it.pk, it.seq = rankTier(rank), int64(rank%8)*8, uint64(id)+1
}

// laneAdapter drives a lane: push, removeAt, head; Fix through the lane's
// heap, as nothing in the package re-keys a queued item in place.
type laneAdapter struct {
	l     *lane
	items map[int]*Item
}

func (a *laneAdapter) Push(id, rank int) {
	it := &Item{Request: Request{Pinned: NoEndpoint}, idx: -1}
	setRank(it, id, rank)
	a.items[id] = it
	a.l.push(it)
}

func (a *laneAdapter) Pop() int {
	it := a.l.head()
	a.l.removeAt(0)
	return int(it.seq - 1)
}

func (a *laneAdapter) Len() int         { return a.l.len() }
func (a *laneAdapter) At(i int) int     { return int(a.l.h.At(i).seq - 1) }
func (a *laneAdapter) Index(id int) int { return int(a.items[id].idx) }

func (a *laneAdapter) Fix(id, rank int) {
	it := a.items[id]
	setRank(it, id, rank)
	a.l.h.Fix(int(it.idx), hotKey(it))
}

func (a *laneAdapter) Remove(id int) { a.l.removeAt(int(a.items[id].idx)) }

// candAdapter drives a class's candidate index: one lane per element, its
// only item giving the lane its rank; candPush, candRemoveAt, candFix.
type candAdapter struct {
	c     *class
	lanes map[int]*lane
}

func (a *candAdapter) Push(id, rank int) {
	l := &lane{h: newItemHeap(), cls: a.c, hidx: -1, pidx: -1}
	it := &Item{Request: Request{Pinned: NoEndpoint}}
	setRank(it, id, rank)
	l.push(it)
	a.lanes[id] = l
	a.c.candPush(l)
}

func (a *candAdapter) Pop() int {
	l := a.c.cand.At(0)
	a.c.candRemoveAt(0)
	return int(l.head().seq - 1)
}

func (a *candAdapter) Len() int         { return a.c.cand.Len() }
func (a *candAdapter) At(i int) int     { return int(a.c.cand.At(i).head().seq - 1) }
func (a *candAdapter) Index(id int) int { return int(a.lanes[id].hidx) }

// Fix changes the lane's head, as a push of a new head or the removal of
// the old one does.
func (a *candAdapter) Fix(id, rank int) {
	l := a.lanes[id]
	setRank(l.head(), id, rank)
	l.h.Fix(0, hotKey(l.head()))
	a.c.candFix(int(l.hidx))
}

func (a *candAdapter) Remove(id int) { a.c.candRemoveAt(int(a.lanes[id].hidx)) }

// tenantAdapter drives a tenant ring: one tenant per element, the rank its
// head's tier and its affordable round, the id its ring position;
// tenPush, tenRemoveAt, tenFix.
type tenantAdapter struct {
	c       *class
	tenants map[int]*tenant
}

// tenSat is where tenKey saturates rounds and positions: the adapter
// places both around it, so that some keys are exact and others leave the
// order to tenLess.
const tenSat = 1<<30 - 1

func (a *tenantAdapter) setRank(t *tenant, rank int) {
	t.sub.head().strict = rankTier(rank)
	t.at = tenSat - 4 + uint64(rank%8)
}

func (a *tenantAdapter) Push(id, rank int) {
	t := &tenant{sub: lane{h: newItemHeap(), cls: a.c, hidx: -1, pidx: -1}, pos: tenSat - 900 + uint64(id), tidx: -1}
	t.sub.push(&Item{Request: Request{Pinned: NoEndpoint}})
	a.setRank(t, rank)
	a.tenants[id] = t
	a.c.tenPush(t)
}

func (a *tenantAdapter) Pop() int {
	t := a.c.tq.At(0)
	a.c.tenRemoveAt(0)
	return int(t.pos - (tenSat - 900))
}

func (a *tenantAdapter) Len() int         { return a.c.tq.Len() }
func (a *tenantAdapter) At(i int) int     { return int(a.c.tq.At(i).pos - (tenSat - 900)) }
func (a *tenantAdapter) Index(id int) int { return int(a.tenants[id].tidx) }

func (a *tenantAdapter) Fix(id, rank int) {
	t := a.tenants[id]
	a.setRank(t, rank)
	a.c.tenFix(int(t.tidx))
}

func (a *tenantAdapter) Remove(id int) { a.c.tenRemoveAt(int(a.tenants[id].tidx)) }
