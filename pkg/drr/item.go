package drr

import (
	"math"
	"math/bits"
)

// Item is a queued request: the immutable snapshot of its Request plus the
// scheduler's bookkeeping. The pointer is the handle for Remove. Callers
// read the embedded Request but must not change it while the item is
// queued: the order key and the pending sums were computed from it.
//
// The layout is kept to 144 bytes (one malloc size class) because one Item
// is retained per waiting request.
type Item struct {
	Request

	seq  uint64 // arrival sequence, the last tie breaker; survives SetClasses
	cost uint64 // scheduling cost, max(1, uncached)
	due  int64  // effective deadline when hasDue
	// pk is the policy key: the effective arrival (fcfs, earlier first),
	// the weight 1+priority (wspt, compared as weight/cost) or the arrival
	// (edf).
	pk int64

	// prev and next link the class's expiry list (arrival order).
	prev, next *Item
	// home is the heap holding the item: the class's shared heap, a
	// tenant's sub-queue or an exact lane; nil once the item has left.
	home *lane
	// ten is the item's tenant in its class, nil when the class keeps none
	// for it.
	ten *tenant

	idx    int32  // position in home.items
	strict uint32 // strict tier as ordered (0 under edf)
	policy Policy
	hasDue bool
	inExp  bool // linked in the class's expiry list
}

// Seq returns the arrival sequence number the scheduler gave the item: the
// last tie breaker of the order (earlier first). It is unique per
// scheduler and survives SetClasses.
func (it *Item) Seq() uint64 { return it.seq }

// Queued reports whether the item is still waiting in the scheduler.
func (it *Item) Queued() bool { return it.home != nil }

// Tenant returns the tenant the item was queued for (the zero Tenant when
// its class keeps none for it).
func (it *Item) Tenant() Tenant {
	if it.ten == nil {
		return Tenant{}
	}
	return it.ten.spec
}

// fcfsSecond is the fcfs priority bump: one unit of soft priority counts as
// one second of earlier arrival (SPEC §3).
const fcfsSecond = int64(1_000_000_000)

// setKey precomputes the order key under the class's policy, so heap
// comparisons never redo it.
func (it *Item) setKey(cfg *ClassConfig) {
	jump := int64(it.Priority)
	if jump < 0 {
		jump = 0 // negative priorities are clamped, never pushed back
	}
	it.policy = cfg.Policy
	it.cost = it.Request.Cost()
	it.strict = it.StrictPriority
	it.due = it.Due
	it.hasDue = it.Due != 0
	switch cfg.Policy {
	case FCFS:
		it.pk = satSubInt64(it.Arrival, jump*fcfsSecond)
	case WSPT:
		it.pk = 1 + jump
	case EDF:
		it.strict = 0
		if !it.hasDue && cfg.WaitBudget > 0 {
			it.due = satAddInt64(it.Arrival, int64(cfg.WaitBudget))
			it.hasDue = true
		}
		it.pk = it.Arrival
	}
}

// before reports whether a is ahead of b in a lane (SPEC §3): strict tier
// (higher first), then deadline (with one before without; earlier first),
// then the policy key, then arrival sequence. Both items belong to the same
// class, hence the same policy.
func before(a, b *Item) bool {
	if a.strict != b.strict {
		return a.strict > b.strict
	}
	if a.hasDue != b.hasDue {
		return a.hasDue
	}
	if a.hasDue && a.due != b.due {
		return a.due < b.due
	}
	if a.policy == WSPT {
		// a first iff wa/ca > wb/cb iff wa·cb > wb·ca, exact in 128 bits.
		h1, l1 := bits.Mul64(uint64(a.pk), b.cost)
		h2, l2 := bits.Mul64(uint64(b.pk), a.cost)
		if h1 != h2 {
			return h1 > h2
		}
		if l1 != l2 {
			return l1 > l2
		}
	} else if a.pk != b.pk {
		return a.pk < b.pk
	}
	return a.seq < b.seq
}

// expiry returns when the item's wait budget runs out.
func (it *Item) expiry(budget int64) int64 { return satAddInt64(it.Arrival, budget) }

func satAddInt64(a, b int64) int64 {
	s := a + b
	if b > 0 && s < a {
		return math.MaxInt64
	}
	if b < 0 && s > a {
		return math.MinInt64
	}
	return s
}

func satSubInt64(a, b int64) int64 {
	s := a - b
	if b > 0 && s > a {
		return math.MinInt64
	}
	if b < 0 && s < a {
		return math.MaxInt64
	}
	return s
}

// sum128 is an exact running sum: pending token sums are added and
// subtracted, so a saturated uint64 would drift. Stats report it saturated.
type sum128 struct{ hi, lo uint64 }

func (s *sum128) add(v uint64) {
	var c uint64
	s.lo, c = bits.Add64(s.lo, v, 0)
	s.hi += c
}

func (s *sum128) sub(v uint64) {
	var b uint64
	s.lo, b = bits.Sub64(s.lo, v, 0)
	s.hi -= b
}

func (s sum128) sat() uint64 {
	if s.hi != 0 {
		return math.MaxUint64
	}
	return s.lo
}
