package drr

import "github.com/laneway-dev/laneway/pkg/iheap"

// Tenants inside a class. Every class counts its tenants with queued
// requests (for per-tenant limits and the tenant bound); a tenant-fair
// class also splits its shared heap into one sub-queue per tenant and
// serves them with a second DRR.
//
// The tenant DRR is the class ring's algorithm (SPEC §4) written so that a
// pop costs O(log T), not a scan of the T backlogged tenants. Number the
// ring's rounds, and give each tenant its ring position (activation order)
// and the credit it held after its last visit, in round lv. Round by
// round the tenant earns its quantum Q at each visit, so its head of cost
// c becomes affordable in round at = lv + ceil((c - credit) / Q) (lv
// itself when the credit already covers it). Round-robin DRR with bulk
// rounds serves heads in (at, position) order: rounds are visited in turn
// and, within one, tenants in ring order. So the backlogged tenants sit in
// a heap by (strict tier of the head, higher first; at; position), and a
// service of the top tenant credits it the rounds up to at and charges c:
// its next head is affordable in the same round exactly when DRR's cursor
// would stay on it. Tenants passed over keep their state: their visits are
// implicit in their own at. A tenant that becomes backlogged joins the end
// of the ring in the round being served, with no credit; an emptied
// sub-queue drops the tenant's DRR state.

// tenant is one tenant of a class with queued requests, dropped with all
// its state when its last request leaves the class.
type tenant struct {
	spec Tenant
	n    uint64 // queued requests of the tenant in the class (shared and pinned)
	raw  sum128 // their raw prompt tokens

	// The tenant DRR (tenant-fair classes): the shared sub-queue, the
	// credit left after the last visit and that visit's round, the ring
	// position, the round the head is affordable, and the heap index (-1
	// when the sub-queue is empty).
	sub    lane
	credit uint64
	lv     uint64
	pos    uint64
	at     uint64
	tidx   int32
}

// quantum is the tenant's DRR quantum in class c: the class quantum times
// its weight.
func (t *tenant) quantum(c *class) uint64 {
	return SaturatingMul(c.cfg.Quantum, max(t.spec.Weight, 1))
}

// tierRound is the tenant DRR's cursor at one strict tier: the round being
// served, the ring position of the tenant served last, and whether that
// tenant's visit goes on (its next head was affordable right after the
// service, so DRR's cursor stays on it). A visit that goes on serves the
// tenant's head as long as its credit covers it, whatever the head turns
// into meanwhile; one that ended does not resume. Rounds start at 1, so a
// newcomer's last visit (the round before) is never negative.
type tierRound struct {
	strict  uint32
	inVisit bool
	round   uint64
	pos     uint64
}

// cursorAt returns the cursor at tier s (round 1, before every position,
// when nothing was served there yet).
func (c *class) cursorAt(s uint32) tierRound {
	for _, r := range c.rounds {
		if r.strict == s {
			return r
		}
	}
	return tierRound{strict: s, round: 1}
}

func (c *class) setCursor(r tierRound) {
	for i := range c.rounds {
		if c.rounds[i].strict == r.strict {
			c.rounds[i] = r
			return
		}
	}
	c.rounds = append(c.rounds, r)
}

// nextVisit is the earliest round the cursor at tier s can serve the
// tenant: this round if it has not reached the tenant's position yet (or
// stands on it in a visit that goes on), else the next.
func (c *class) nextVisit(t *tenant, s uint32) uint64 {
	cur := c.cursorAt(s)
	if t.pos > cur.pos || (t.pos == cur.pos && cur.inVisit) {
		return cur.round
	}
	return cur.round + 1
}

// tenantOf returns the class's state for a tenant, creating it (empty) if
// create is set.
func (c *class) tenantOf(spec *Tenant, create bool) *tenant {
	t := c.tenants[spec.Name]
	if t == nil && create {
		var h iheap.Heap[*Item]
		if n := len(c.freeTenants); n > 0 { // many callers with a request each: reuse
			t = c.freeTenants[n-1]
			c.freeTenants[n-1] = nil
			c.freeTenants = c.freeTenants[:n-1]
			h = t.sub.h
		} else {
			t, h = &tenant{}, newItemHeap()
		}
		*t = tenant{spec: *spec, tidx: -1}
		t.sub = lane{h: h, cls: c, hidx: -1, pidx: -1}
		if c.tenants == nil {
			c.tenants = make(map[string]*tenant)
		}
		c.tenants[spec.Name] = t
	}
	return t
}

// admitTenant checks the tenant's own limits and the class's tenant bound
// before one more request of it is queued.
func (c *class) admitTenant(spec *Tenant) *Rejection {
	t := c.tenants[spec.Name]
	if t == nil {
		if c.cfg.MaxTenants > 0 && len(c.tenants) >= c.cfg.MaxTenants {
			return &Rejection{Class: c.cfg.Name, Tenant: spec.Name, Kind: LimitTenants,
				Current: uint64(len(c.tenants)), Limit: uint64(c.cfg.MaxTenants)}
		}
		return nil
	}
	if l := spec.RequestLimit; l != 0 && l != NoLimit && t.n >= l {
		return &Rejection{Class: c.cfg.Name, Tenant: spec.Name, Kind: LimitRequests, Current: t.n, Limit: l}
	}
	if l := spec.RawISLLimit; l != 0 && l != NoLimit && t.raw.sat() >= l {
		return &Rejection{Class: c.cfg.Name, Tenant: spec.Name, Kind: LimitRawISLTokens, Current: t.raw.sat(), Limit: l}
	}
	return nil
}

// rounds is how many rounds of quantum q it takes credit to reach cost:
// 0 when it already does.
func rounds(cost, credit, q uint64) uint64 {
	if credit >= cost {
		return 0
	}
	need := cost - credit
	r := need / q
	if need%q != 0 {
		r++
	}
	return r
}

// pushShared queues it in its tenant's sub-queue, activating the tenant in
// the tenant ring if the sub-queue was empty: it joins the end of the ring
// in the round being served at its head's tier, with no credit.
func (c *class) pushShared(t *tenant, it *Item) {
	t.sub.push(it)
	switch {
	case t.tidx < 0:
		t.credit, t.pos = 0, c.nextPos
		c.nextPos++
		t.lv = c.nextVisit(t, it.strict) - 1
		t.at = SaturatingAdd(t.lv, rounds(it.cost, 0, t.quantum(c)))
		c.tenPush(t)
	case it.idx == 0:
		c.tenHeadChanged(t)
	}
}

// tenHeadChanged recomputes when the tenant's new head is affordable (at
// its next visit at the earliest: a head that changed meanwhile cannot be
// served in a round the cursor has left) and restores the heap.
func (c *class) tenHeadChanged(t *tenant) {
	h := t.sub.head()
	t.at = max(SaturatingAdd(t.lv, rounds(h.cost, t.credit, t.quantum(c))), c.nextVisit(t, h.strict))
	c.tenFix(int(t.tidx))
}

// serveTenant charges the tenant for its head, it, which is leaving as
// the class's dispatch: it earns the rounds up to at, pays the head's cost,
// and the cursor at its tier moves onto it, in a visit that goes on until
// settleVisit has seen the next head.
func (c *class) serveTenant(t *tenant, it *Item) {
	q := t.quantum(c)
	t.credit = SaturatingAdd(t.credit, SaturatingMul(t.at-t.lv, q)) - it.cost
	t.lv = t.at
	c.setCursor(tierRound{strict: it.strict, inVisit: true, round: t.at, pos: t.pos})
}

// settleVisit ends the visit of the tenant just served at tier s unless
// its next head, now in place, is affordable in the same round at the same
// tier (SPEC §4 step 3: the cursor stays only then).
func (c *class) settleVisit(t *tenant, s uint32) {
	for i := range c.rounds {
		r := &c.rounds[i]
		if r.strict == s && r.pos == t.pos {
			r.inVisit = t.tidx >= 0 && t.at == r.round && t.sub.head().strict == s
		}
	}
}

// unlinkTenant updates the tenant's counts for it, which left the class
// (fromSub: from the tenant's sub-queue; wasHead: as its head).
func (c *class) unlinkTenant(t *tenant, it *Item, fromSub, wasHead bool) {
	t.n--
	t.raw.sub(it.RawISL)
	if fromSub {
		switch {
		case t.sub.len() == 0:
			c.tenRemoveAt(int(t.tidx))
			t.credit, t.lv, t.at = 0, 0, 0
			if c.tq.Len() == 0 {
				c.rounds = c.rounds[:0] // nothing backlogged: rounds restart
			}
		case wasHead:
			c.tenHeadChanged(t)
		}
	}
	if t.n == 0 {
		delete(c.tenants, t.spec.Name)
		c.recycleTenant(t)
	}
}

// recycleTenant keeps an emptied tenant's struct and small sub-queue
// buffer for the next new tenant, up to maxFreeLanes of them, as dropLane
// does for exact lanes. t is no longer in c.tenants.
func (c *class) recycleTenant(t *tenant) {
	if len(c.freeTenants) >= maxFreeLanes {
		return
	}
	h := t.sub.h
	h.Reset(maxRecycledCap)
	*t = tenant{sub: lane{h: h}}
	c.freeTenants = append(c.freeTenants, t)
}

// The tenant heap: backlogged tenants of a tenant-fair class by head tier
// (higher first), affordable round and ring position.

func newTenantHeap() iheap.Heap[*tenant] { return iheap.New(tenLess) }

// tenKey is a prefix of tenLess's order (tenKey(a) < tenKey(b) implies
// tenLess(a, b)), exact while rounds and positions stay below 2^30: the
// tier in 4 bits (as hotKey: tiers >= 15 share the key 0), the round in 30
// and the position in 30. A round past that saturates and drops the
// position, and a position past that saturates, leaving the rest to
// tenLess. Many tenants wait for the same round, so the position matters:
// without it most comparisons would fall through to tenLess.
func tenKey(t *tenant) uint64 {
	const sat = 1<<30 - 1
	s := t.sub.head().strict
	if s >= 15 {
		return 0
	}
	k := uint64(15-s) << 60
	if t.at >= sat {
		return k | sat<<30
	}
	return k | t.at<<30 | min(t.pos, sat)
}

func tenLess(a, b *tenant) bool {
	ha, hb := a.sub.head(), b.sub.head()
	if ha.strict != hb.strict {
		return ha.strict > hb.strict
	}
	if a.at != b.at {
		return a.at < b.at
	}
	return a.pos < b.pos
}

func (c *class) tenPush(t *tenant) { c.tq.Push(tenKey(t), t, &t.tidx) }

func (c *class) tenRemoveAt(i int) { c.tq.Remove(i) }

// tenFix restores the heap after the tenant at i changed its head or its
// round.
func (c *class) tenFix(i int) { c.tq.Fix(i, tenKey(c.tq.At(i))) }

// TenantStats is one tenant's queue in one class, for status pages.
type TenantStats struct {
	Name          string
	Pending       uint64 // queued requests
	PendingRawISL uint64 // their raw prompt tokens
	// Credit is the tenant's DRR credit after its last visit
	// (tenant-fair classes).
	Credit uint64
}

// Tenants calls fn with every tenant that has requests queued in class i,
// in no particular order. O(T).
func (s *Scheduler) Tenants(i int, fn func(TenantStats)) {
	for _, t := range s.classes[i].tenants {
		fn(TenantStats{Name: t.spec.Name, Pending: t.n, PendingRawISL: t.raw.sat(), Credit: t.credit})
	}
}
