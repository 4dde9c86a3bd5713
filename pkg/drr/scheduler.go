package drr

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"

	"github.com/laneway-dev/laneway/pkg/iheap"
)

// class is one physical policy class: its lanes, DRR deficit, pending sums
// and expiry list.
type class struct {
	cfg     ClassConfig
	idx     int
	deficit uint64

	shared lane
	lanes  map[EndpointID]*lane
	// cand indexes the exact lanes not known to be blocked, by head.
	cand iheap.Heap[*lane]

	n      uint64 // queued requests
	raw    sum128 // queued raw prompt tokens
	cached sum128 // queued cached tokens

	// expHead..expTail is the arrival-ordered list of the class's items when
	// it has a wait budget: the oldest expires first.
	expHead, expTail *Item

	// tenants holds the tenants with queued requests (tenant.go); in a
	// tenant-fair class tq is the heap of those with a non-empty shared
	// sub-queue, rounds the tenant DRR's cursor per strict tier, and
	// nextPos the next ring position.
	tenants map[string]*tenant
	tq      iheap.Heap[*tenant]
	rounds  []tierRound
	nextPos uint64
	// freeTenants recycles emptied tenants (recycleTenant): callers with
	// one request each empty and come back at every request.
	freeTenants []*tenant
}

// Scheduler is the policy-class DRR queue. It is not safe for concurrent
// use: one goroutine (the dispatcher) owns it.
type Scheduler struct {
	classes []*class
	cursor  int
	seq     uint64
	n       int
	eps     map[EndpointID]*epState

	// freeLanes recycles exact lanes: a lane empties and comes back often
	// (one pinned request at a time), and reusing it keeps Offer and Pop
	// free of lane allocations.
	freeLanes []*lane

	// Scratch for one arbitration, sized to the class count so Pop does not
	// allocate: each class's dispatchable candidate and its deficit before
	// the call (restored when the call ends with Unroutable).
	scratchCand []*Item
	scratchDef  []uint64
}

// maxFreeLanes bounds the lane free list.
const maxFreeLanes = 1024

// maxRecycledCap bounds the heap capacity a recycled lane keeps.
const maxRecycledCap = 64

// New returns a scheduler for the given classes (at least one). The ring
// order is the slice order. Class names must be unique (deficits follow
// names across SetClasses).
func New(classes []ClassConfig) (*Scheduler, error) {
	cs, err := buildClasses(classes)
	if err != nil {
		return nil, fmt.Errorf("drr: new scheduler: %w", err)
	}
	s := &Scheduler{eps: make(map[EndpointID]*epState)}
	s.install(cs)
	return s, nil
}

// buildClasses validates configs and returns empty classes for them.
func buildClasses(cfgs []ClassConfig) ([]*class, error) {
	if len(cfgs) == 0 {
		return nil, errors.New("at least one policy class is required")
	}
	seen := make(map[string]int, len(cfgs))
	cs := make([]*class, len(cfgs))
	for i, cfg := range cfgs {
		if j, dup := seen[cfg.Name]; dup {
			return nil, fmt.Errorf("policy class %q (index %d): name already used by index %d", cfg.Name, i, j)
		}
		seen[cfg.Name] = i
		if cfg.Quantum == 0 {
			return nil, fmt.Errorf("policy class %q (index %d): quantum must be > 0", cfg.Name, i)
		}
		if cfg.Policy > EDF {
			return nil, fmt.Errorf("policy class %q (index %d): unknown queue policy %v", cfg.Name, i, cfg.Policy)
		}
		if cfg.WaitBudget < 0 {
			return nil, fmt.Errorf("policy class %q (index %d): wait budget %v must be >= 0", cfg.Name, i, cfg.WaitBudget)
		}
		if cfg.MaxTenants < 0 {
			return nil, fmt.Errorf("policy class %q (index %d): max tenants %d must be >= 0", cfg.Name, i, cfg.MaxTenants)
		}
		c := &class{cfg: cfg, idx: i, lanes: make(map[EndpointID]*lane), cand: newCandHeap(), tq: newTenantHeap(), nextPos: 1}
		c.shared = lane{h: newItemHeap(), cls: c, hidx: -1, pidx: -1}
		cs[i] = c
	}
	return cs, nil
}

func (s *Scheduler) install(cs []*class) {
	s.classes = cs
	s.scratchCand = make([]*Item, len(cs))
	s.scratchDef = make([]uint64, len(cs))
}

// NumClasses returns the number of classes in the ring.
func (s *Scheduler) NumClasses() int { return len(s.classes) }

// Class returns the configuration of class i (ring order).
func (s *Scheduler) Class(i int) ClassConfig { return s.classes[i].cfg }

// Offer admits a request of tenant t (SPEC §5). It returns (nil, nil)
// when the request should be dispatched directly (its class does not queue,
// or the class has no backlog and allBusy is false); an Item when it was
// queued; or a *Rejection when a queue limit is reached: the class's,
// scaled by endpoints, then the tenant's own, then the class's tenant
// bound. allBusy is the caller's busy test over the request's eligible
// endpoints. A class index out of range is an error (not a *Rejection).
//
// The zero Tenant is no tenant: a class keeps no per-tenant state for it
// unless the class is tenant-fair, where it is the anonymous tenant.
func (s *Scheduler) Offer(r Request, t Tenant, endpoints int, allBusy bool) (*Item, error) {
	if r.Class < 0 || int(r.Class) >= len(s.classes) {
		return nil, fmt.Errorf("drr: offer: class index %d out of range [0,%d)", r.Class, len(s.classes))
	}
	c := s.classes[r.Class]
	// New arrivals never bypass a backlog of their own class.
	if !c.cfg.Queueing || (c.n == 0 && !allBusy) {
		return nil, nil
	}
	if rej := c.admit(endpoints); rej != nil {
		return nil, rej
	}
	if c.tracksTenant(&t) {
		if rej := c.admitTenant(&t); rej != nil {
			return nil, rej
		}
	}
	it := &Item{Request: r}
	if it.Cached > it.RawISL {
		it.Cached = it.RawISL
	}
	s.seq++
	it.seq = s.seq
	s.insert(c, it, &t)
	return it, nil
}

// tracksTenant reports whether the class keeps per-tenant state for t: a
// tenant-fair class always (the zero Tenant is the anonymous one), any
// class for a named tenant.
func (c *class) tracksTenant(t *Tenant) bool { return c.cfg.TenantFairness || t.Name != "" }

// admit checks the class's limits before one more request is added: reject
// when current >= per-worker limit × endpoints.
func (c *class) admit(endpoints int) *Rejection {
	eps := uint64(0)
	if endpoints > 0 {
		eps = uint64(endpoints)
	}
	check := func(kind LimitKind, perWorker, current uint64) *Rejection {
		if perWorker == NoLimit {
			return nil
		}
		limit := SaturatingMul(perWorker, eps)
		if current >= limit {
			return &Rejection{Class: c.cfg.Name, Kind: kind, Current: current, Limit: limit}
		}
		return nil
	}
	if r := check(LimitRequests, c.cfg.RequestLimitPerWorker, c.n); r != nil {
		return r
	}
	if r := check(LimitRawISLTokens, c.cfg.RawISLLimitPerWorker, c.raw.sat()); r != nil {
		return r
	}
	return check(LimitCachedTokens, c.cfg.CachedLimitPerWorker, c.cached.sat())
}

// insert queues it in class c for tenant t: key, tenant, lane, expiry
// list, sums.
func (s *Scheduler) insert(c *class, it *Item, t *Tenant) {
	it.setKey(&c.cfg)
	if c.tracksTenant(t) {
		ten := c.tenantOf(t, true)
		ten.spec = *t // the latest offer's weight and limits
		ten.n++
		ten.raw.add(it.RawISL)
		it.ten = ten
	}
	switch {
	case it.Pinned == NoEndpoint && c.cfg.TenantFairness:
		c.pushShared(it.ten, it)
	case it.Pinned == NoEndpoint:
		c.shared.push(it)
	default:
		l := c.lanes[it.Pinned]
		if l == nil {
			l = s.newLane(c, it.Pinned)
			l.push(it)
			c.candPush(l)
		} else {
			l.push(it)
			if l.hidx >= 0 && it.idx == 0 {
				c.candFix(int(l.hidx))
			}
		}
	}
	if c.cfg.WaitBudget > 0 {
		c.expInsert(it)
	}
	c.n++
	c.raw.add(it.RawISL)
	c.cached.add(it.Cached)
	s.n++
}

// newLane creates the exact lane of ep in c, with no cached verdict; the
// caller pushes its first item and puts it in the candidate index.
func (s *Scheduler) newLane(c *class, ep EndpointID) *lane {
	st := s.eps[ep]
	if st == nil {
		st = &epState{id: ep}
		s.eps[ep] = st
	}
	st.refs++
	var l *lane
	if n := len(s.freeLanes); n > 0 {
		l = s.freeLanes[n-1]
		s.freeLanes[n-1] = nil
		s.freeLanes = s.freeLanes[:n-1]
	} else {
		l = &lane{h: newItemHeap()}
	}
	*l = lane{h: l.h, cls: c, ep: st, hidx: -1, pidx: -1}
	c.lanes[ep] = l
	return l
}

// dropLane forgets an empty exact lane.
func (s *Scheduler) dropLane(l *lane) {
	c, st := l.cls, l.ep
	if l.hidx >= 0 {
		c.candRemoveAt(int(l.hidx))
	}
	if l.pidx >= 0 {
		st.unpark(l)
	}
	delete(c.lanes, st.id)
	st.refs--
	if st.refs == 0 {
		delete(s.eps, st.id)
	}
	h := l.h
	h.Reset(maxRecycledCap)
	*l = lane{h: h}
	if len(s.freeLanes) < maxFreeLanes {
		s.freeLanes = append(s.freeLanes, l)
	}
}

func (st *epState) park(l *lane) {
	l.pidx = int32(len(st.parked))
	st.parked = append(st.parked, l)
}

func (st *epState) unpark(l *lane) {
	i, n := int(l.pidx), len(st.parked)-1
	if i != n {
		st.parked[i] = st.parked[n]
		st.parked[i].pidx = int32(i)
	}
	st.parked[n] = nil
	st.parked = st.parked[:n]
	l.pidx = -1
}

// expInsert links it into the class's expiry list, keeping arrival order:
// at the tail when arrivals are monotone, else walking back from the tail.
func (c *class) expInsert(it *Item) {
	it.inExp = true
	p := c.expTail
	for p != nil && p.Arrival > it.Arrival {
		p = p.prev
	}
	it.prev = p
	if p == nil {
		it.next = c.expHead
		c.expHead = it
	} else {
		it.next = p.next
		p.next = it
	}
	if it.next == nil {
		c.expTail = it
	} else {
		it.next.prev = it
	}
}

func (c *class) expUnlink(it *Item) {
	if it.prev == nil {
		c.expHead = it.next
	} else {
		it.prev.next = it.next
	}
	if it.next == nil {
		c.expTail = it.prev
	} else {
		it.next.prev = it.prev
	}
	it.prev, it.next, it.inExp = nil, nil, false
}

// unlink takes a queued item out of every structure and the sums. A class
// left empty has its deficit reset (SPEC §4: an empty class holds no
// credit).
func (s *Scheduler) unlink(it *Item) {
	l := it.home
	c := l.cls
	wasHead := it.idx == 0
	l.removeAt(int(it.idx))
	if l.ep != nil {
		if l.len() == 0 {
			s.dropLane(l)
		} else if wasHead && l.hidx >= 0 {
			c.candFix(int(l.hidx))
		}
	}
	if t := it.ten; t != nil {
		c.unlinkTenant(t, it, l == &t.sub, wasHead)
		it.ten = nil
	}
	if it.inExp {
		c.expUnlink(it)
	}
	c.n--
	c.raw.sub(it.RawISL)
	c.cached.sub(it.Cached)
	s.n--
	if c.n == 0 {
		c.deficit = 0
	}
	it.home = nil
	it.idx = -1
}

// Remove takes a queued item out (its client went away) in O(log n). It
// reports false if the item is no longer queued.
func (s *Scheduler) Remove(it *Item) bool {
	if it == nil || it.home == nil {
		return false
	}
	s.unlink(it)
	return true
}

// Pop runs one arbitration (SPEC §4) and returns the next item to leave the
// queue and why. Expired items (WaitBudget elapsed at now) leave first;
// then heads judged Unroutable (Outcome NoRoute); then one DRR dispatch.
// It returns (nil, None) when nothing can leave. Call it in a loop until
// None.
//
// Lane verdicts are cached until EndpointChanged: after dispatching to an
// endpoint (which changes its load), the caller reports that endpoint.
//
// One deliberate refinement of SPEC §4 step 2: of the bulk rounds, the
// last is granted in ring order up to the class that dispatches; classes
// after it in the scan get that round at their next visit (see below).
func (s *Scheduler) Pop(now int64, p Probe) (*Item, Outcome) {
	if s.n == 0 {
		return nil, None
	}
	if it := s.firstExpired(now); it != nil {
		s.unlink(it)
		return it, Expired
	}
	nc := len(s.classes)
	cands, saved := s.scratchCand, s.scratchDef
	found := false
	ci := s.cursor
	for k := 0; k < nc; k++ {
		c := s.classes[ci]
		saved[ci] = c.deficit
		cands[ci] = nil
		if c.n == 0 {
			c.deficit = 0
		} else {
			it, bad := s.candidate(c, p)
			if bad != nil {
				// Leave no trace of this scan: the item answers 503 and
				// the ring is as if the call had not happened.
				for j, cj := 0, s.cursor; j <= k; j++ {
					s.classes[cj].deficit = saved[cj]
					if cj++; cj == nc {
						cj = 0
					}
				}
				s.unlink(bad)
				return bad, NoRoute
			}
			if it != nil {
				cands[ci] = it
				found = true
				if c.deficit >= it.cost {
					return s.dispatch(c, it), Dispatch
				}
				c.deficit = SaturatingAdd(c.deficit, c.cfg.Quantum)
				if c.deficit >= it.cost {
					return s.dispatch(c, it), Dispatch
				}
			}
		}
		if ci++; ci == nc {
			ci = 0
		}
	}
	if !found {
		return nil, None // every head blocked: no credit at all
	}
	// Bulk virtual rounds: the fewest whole rounds after which some
	// candidate is affordable, granted to every candidate class alike so
	// the weighting holds and the call costs O(C) whatever the cost.
	//
	// The last of those rounds is replayed in ring order and stops at the
	// first class that can pay, as round-by-round DRR would: the classes
	// after it in this pass have not been visited in that round yet, so
	// they earn it at their next visit. Granting it to them now as well
	// would give them a second quantum in a row when the cursor reaches
	// them next, a bias that accumulates without bound.
	//
	// The fewest rounds belong to the smallest need/quantum ratio; compare
	// ratios exactly by cross-multiplying and divide once.
	var minNeed, minQ uint64
	for i, it := range cands {
		if it == nil {
			continue
		}
		c := s.classes[i]
		need := it.cost - c.deficit // > 0: the scan found it unaffordable
		if minQ == 0 || ratioLess(need, c.cfg.Quantum, minNeed, minQ) {
			minNeed, minQ = need, c.cfg.Quantum
		}
	}
	if n := rounds(minNeed, 0, minQ); n > 1 {
		for i, it := range cands {
			if it != nil {
				c := s.classes[i]
				c.deficit = SaturatingAdd(c.deficit, SaturatingMul(c.cfg.Quantum, n-1))
			}
		}
	}
	ci = s.cursor
	for k := 0; k < nc; k++ {
		if it := cands[ci]; it != nil {
			c := s.classes[ci]
			c.deficit = SaturatingAdd(c.deficit, c.cfg.Quantum)
			if c.deficit >= it.cost {
				return s.dispatch(c, it), Dispatch
			}
		}
		if ci++; ci == nc {
			ci = 0
		}
	}
	return nil, None // unreachable: the class with the fewest rounds can pay
}

// ratioLess reports a/b < c/d, exactly.
func ratioLess(a, b, c, d uint64) bool {
	h1, l1 := bits.Mul64(a, d)
	h2, l2 := bits.Mul64(c, b)
	return h1 < h2 || (h1 == h2 && l1 < l2)
}

// candidate returns the class's best dispatchable head (shared head or best
// ready exact-lane head), or an Unroutable head to hand back.
func (s *Scheduler) candidate(c *class, p Probe) (best, unroutable *Item) {
	if h := c.sharedHead(); h != nil {
		switch p.Shared(c.idx, h) {
		case Ready:
			best = h
		case Unroutable:
			return nil, h
		}
	}
	for c.cand.Len() > 0 {
		l := c.cand.At(0)
		if !l.verdictCached() {
			switch p.Lane(c.idx, l.ep.id) {
			case Ready:
				l.ready, l.readyGen = true, l.ep.gen
			case Unroutable:
				return nil, l.head()
			default: // Blocked: park until the endpoint changes
				c.candRemoveAt(0)
				l.ready = false
				l.ep.park(l)
				continue
			}
		}
		if h := l.head(); best == nil || before(h, best) {
			best = h
		}
		break
	}
	return best, nil
}

// dispatch charges c for it, takes it out and moves the cursor (SPEC §4
// step 3).
func (s *Scheduler) dispatch(c *class, it *Item) *Item {
	c.deficit -= it.cost
	t := it.ten
	fromSub := t != nil && it.home == &t.sub
	if fromSub {
		c.serveTenant(t, it)
	}
	s.unlink(it)
	if fromSub {
		c.settleVisit(t, it.strict)
	}
	s.cursor = c.idx
	if c.n == 0 || !c.nextAffordable() {
		if s.cursor++; s.cursor == len(s.classes) {
			s.cursor = 0
		}
	}
	return it
}

// nextAffordable reports whether the class's next head (best of the shared
// head and the indexed lane heads, verdicts aside) fits its deficit, in
// which case the class keeps the cursor to spend its burst.
func (c *class) nextAffordable() bool {
	h := c.sharedHead()
	if c.cand.Len() > 0 {
		if lh := c.cand.At(0).head(); h == nil || before(lh, h) {
			h = lh
		}
	}
	return h != nil && c.deficit >= h.cost
}

// sharedHead is the head of the class's shared heap: in a tenant-fair
// class, the head of the tenant the tenant DRR serves next. Nil when there
// is none.
func (c *class) sharedHead() *Item {
	if c.cfg.TenantFairness {
		if c.tq.Len() > 0 {
			return c.tq.At(0).sub.head()
		}
		return nil
	}
	if c.shared.len() > 0 {
		return c.shared.head()
	}
	return nil
}

// firstExpired returns the queued item with the earliest expiry if that is
// at or before now.
func (s *Scheduler) firstExpired(now int64) *Item {
	var best *Item
	var at int64
	for _, c := range s.classes {
		if h := c.expHead; h != nil {
			if e := h.expiry(int64(c.cfg.WaitBudget)); e <= now && (best == nil || e < at) {
				best, at = h, e
			}
		}
	}
	return best
}

// EndpointChanged invalidates the cached verdicts of every lane of ep, in
// every class, so that the next Pop asks the Probe again. Blocked lanes of
// ep return to their classes' candidate indexes.
func (s *Scheduler) EndpointChanged(ep EndpointID) {
	st := s.eps[ep]
	if st == nil {
		return // no lane of ep, so no cached verdict
	}
	st.gen++
	for i, l := range st.parked {
		st.parked[i] = nil
		l.pidx = -1
		l.ready = false
		l.cls.candPush(l)
	}
	st.parked = st.parked[:0]
}

// NextExpiry returns the earliest time a queued item's WaitBudget runs out.
func (s *Scheduler) NextExpiry() (at int64, ok bool) {
	for _, c := range s.classes {
		if h := c.expHead; h != nil {
			if e := h.expiry(int64(c.cfg.WaitBudget)); !ok || e < at {
				at, ok = e, true
			}
		}
	}
	return at, ok
}

// SetClasses replaces the class set without losing or reordering queued
// requests. classify gives each queued item its class index in the new set
// (the scheduler then keeps its arrival order) and its tenant there: a
// changed weight or limit, a new name, or it.Tenant() to keep the one it
// has. classify may also change the item's Priority and StrictPriority (a
// new cap): items are ordered again from their Request. Classes that keep
// their name keep their deficit; tenant DRR credit restarts from zero (it
// belongs to the old ring). On error (invalid config, index out of range)
// nothing changes.
//
// Items are re-keyed under their new class's policy; their arrival
// sequence, the final tie breaker, is kept. Cached lane verdicts are
// dropped. The cursor stays on its class if that name survives, else it
// restarts at 0. Queue limits are not re-applied to queued items.
func (s *Scheduler) SetClasses(classes []ClassConfig, classify func(*Item) (int, Tenant)) error {
	cs, err := buildClasses(classes)
	if err != nil {
		return fmt.Errorf("drr: set classes: %w", err)
	}
	items := s.all()
	dest := make([]int, len(items))
	tenants := make([]Tenant, len(items))
	for i, it := range items {
		ci, t := classify(it)
		if ci < 0 || ci >= len(cs) {
			return fmt.Errorf("drr: set classes: item %d (class %q) classified to index %d, out of range [0,%d)",
				it.seq, it.home.cls.cfg.Name, ci, len(cs))
		}
		dest[i], tenants[i] = ci, t
	}
	byName := make(map[string]*class, len(cs))
	for _, c := range cs {
		byName[c.cfg.Name] = c
	}
	cursorName := s.classes[s.cursor].cfg.Name
	for _, old := range s.classes {
		if c := byName[old.cfg.Name]; c != nil {
			c.deficit = old.deficit
		}
	}
	// Insert oldest first so each expiry list is built at its tail.
	order := make([]int, len(items))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		x, y := items[a], items[b]
		if x.Arrival != y.Arrival {
			if x.Arrival < y.Arrival {
				return -1
			}
			return 1
		}
		if x.seq < y.seq {
			return -1
		}
		return 1
	})
	s.eps = make(map[EndpointID]*epState)
	s.freeLanes = nil
	s.n = 0
	s.install(cs)
	for _, i := range order {
		it := items[i]
		*it = Item{Request: it.Request, seq: it.seq}
		it.Class = int32(dest[i])
		s.insert(cs[dest[i]], it, &tenants[i])
	}
	s.cursor = 0
	for _, c := range cs {
		if c.n == 0 {
			c.deficit = 0
		}
		if c.cfg.Name == cursorName {
			s.cursor = c.idx
		}
	}
	return nil
}

// all returns every queued item.
func (s *Scheduler) all() []*Item {
	out := make([]*Item, 0, s.n)
	for _, c := range s.classes {
		out = c.shared.appendItems(out)
		for i := range c.tq.Len() {
			out = c.tq.At(i).sub.appendItems(out)
		}
		for _, l := range c.lanes {
			out = l.appendItems(out)
		}
	}
	return out
}

// Stats returns per-class statistics in ring order.
func (s *Scheduler) Stats() []ClassStats {
	out := make([]ClassStats, len(s.classes))
	for i, c := range s.classes {
		out[i] = ClassStats{
			Name:          c.cfg.Name,
			Pending:       c.n,
			PendingRawISL: c.raw.sat(),
			PendingCached: c.cached.sat(),
			Deficit:       c.deficit,
			Tenants:       len(c.tenants),
		}
	}
	return out
}

// Len returns the number of queued requests.
func (s *Scheduler) Len() int { return s.n }
