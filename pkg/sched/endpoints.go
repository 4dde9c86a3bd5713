package sched

import (
	"fmt"
	"net"
	"sort"

	"github.com/laneway-dev/laneway/pkg/autothreshold"
	"github.com/laneway-dev/laneway/pkg/drr"
	"github.com/laneway-dev/laneway/pkg/policy"
)

// endpoint is one model-server endpoint's state. A removed endpoint keeps
// its struct (removed set) for as long as an allow-list refers to it, while
// its id may already name a newcomer: eligibility follows the pointer.
type endpoint struct {
	id            drr.EndpointID
	addr          string
	maxBatched    uint64
	rank          int
	tainted       bool
	removed       bool
	activePrefill uint64
	inFlight      int

	engine policy.Engine
	// stale: metrics are expected and not fresh (busy, ranked last).
	stale bool
	// peakOurs is the most requests this picker had charged there with
	// their stream open since the last metrics delivery (ours()): the
	// most of the engine's queue that can be ours besides the ledger's.
	peakOurs int
	// sent counts the grants dispatched there (for the ledger's share).
	sent uint64
	// led reconciles what this picker sent with the engine's counters.
	led ledger
	// unseenWaiting and unseenPrefill: the engine's waiting requests that
	// no charge of ours covers (another replica's, a bypassing client's,
	// our own released from the ledger), and the prompt tokens the busy
	// test counts for them.
	unseenWaiting int
	unseenPrefill uint64
	// drainAt is when the next unseen request's or awaiting grant's
	// prefill is assumed to have started: the scrape that counted the
	// queue, or the predicted prefill end of the one before it (ledger.go).
	drainAt int64
	// draining: e is in the core's drainingEps.
	draining bool
	// waiting is the engine's whole waiting queue at the last fresh scrape
	// (ours included), for the overload filter.
	waiting int
	// decoding is our requests past their first byte and not finished;
	// running the engine's running requests at the last scrape.
	decoding int
	running  int
	// engineBS is the engine's reported KV block size (0 unknown).
	engineBS int
	// role is what the endpoint serves (roles.go); kvUsage its engine's
	// KV-cache use at the last fresh scrape (0..1, 0 unknown), which
	// orders decode pods.
	role    Role
	kvUsage float64
	// lora is its adapters as the core knows them (lora.go).
	lora loraState
	// auto is the endpoint's threshold for classes with
	// prefill_busy_threshold auto, fed at each fresh scrape.
	auto autothreshold.Controller
}

// load is the prefill the busy test counts: ours, the other replicas'
// requests on their way as far as our awaiting grants tell
// (othersOnTheirWay), and the unseen estimate.
func (e *endpoint) load() uint64 {
	return drr.SaturatingAdd(drr.SaturatingAdd(e.activePrefill, e.led.othersOnTheirWay()), e.unseenPrefill)
}

// ours is how many of our requests with an open stream may be in the
// engine's queue: those not yet past their first byte.
func (e *endpoint) ours() int { return max(0, e.inFlight-e.decoding) }

// registry maps addresses to endpoints and hands out their ids: the index
// of drr's exact lanes, the prefix index's slots and the overlap scratch.
type registry struct {
	eps     []*endpoint // by drr.EndpointID; nil = free
	byAddr  map[string]*endpoint
	byIP    map[string][]*endpoint
	live    []drr.EndpointID // address order
	freeIDs []drr.EndpointID
	// prefillPods counts the live prefill-only endpoints: requests
	// disaggregate only while it is not zero (roles.go).
	prefillPods int
}

func newRegistry() registry {
	return registry{byAddr: map[string]*endpoint{}, byIP: map[string][]*endpoint{}}
}

func (g *registry) byID(id drr.EndpointID) *endpoint {
	if int(id) < len(g.eps) {
		return g.eps[id]
	}
	return nil
}

// SetEndpoints replaces the endpoint set at now. Endpoints keep their
// accounting by address; requests pinned to a removed endpoint leave with
// 503, and queued shared requests are examined again at the next Drain.
func (c *Core) SetEndpoints(now int64, eps []Endpoint) {
	g := &c.reg
	seen := make(map[string]bool, len(eps))
	for _, in := range eps {
		if in.Addr == "" || seen[in.Addr] {
			continue
		}
		seen[in.Addr] = true
		eng := EngineOf(in.Engine, c.opts.DefaultEngine)
		if e, ok := g.byAddr[in.Addr]; ok {
			e.engine = eng
			if e.maxBatched != in.MaxBatchedTokens || e.tainted != in.Tainted || e.rank != in.Rank || e.role != in.Role {
				if e.maxBatched != in.MaxBatchedTokens {
					e.auto.Reset(in.MaxBatchedTokens) // a new step budget: start over
				}
				e.maxBatched, e.tainted, e.rank, e.role = in.MaxBatchedTokens, in.Tainted, in.Rank, in.Role
				c.q.EndpointChanged(e.id)
			}
			continue
		}
		var id drr.EndpointID
		if n := len(g.freeIDs); n > 0 {
			id = g.freeIDs[n-1]
			g.freeIDs = g.freeIDs[:n-1]
		} else {
			id = drr.EndpointID(len(g.eps))
			g.eps = append(g.eps, nil)
		}
		e := &endpoint{id: id, addr: in.Addr, maxBatched: in.MaxBatchedTokens, tainted: in.Tainted,
			rank: in.Rank, engine: eng, stale: c.opts.ExpectMetrics, role: in.Role, led: newLedger()}
		e.auto.Reset(in.MaxBatchedTokens)
		g.eps[id] = e
		if c.index != nil {
			c.index.Drop(int(id)) // a reused id starts with an empty index
		}
		g.byAddr[in.Addr] = e
		c.q.EndpointChanged(id)
	}
	var removed []drr.EndpointID
	for addr, e := range g.byAddr {
		if !seen[addr] {
			e.removed = true
			delete(g.byAddr, addr)
			c.q.EndpointChanged(e.id)
			removed = append(removed, e.id)
			for e.led.len() > 0 { // nothing waits on a gone endpoint's engine
				c.confirm(e)
			}
			if c.index != nil {
				c.index.Drop(int(e.id))
			}
		}
	}
	c.rebuildAddrMaps()
	c.countRoles()
	if len(removed) == 0 {
		return
	}
	c.updateHashBlockSize()
	// The exact lanes of removed endpoints empty out (503) in this drain;
	// only then may their ids be reused, as a lane is keyed by id. Its
	// decisions stay in the outbox for the caller's Drain.
	c.out = append(c.out, c.Drain(now)...)
	for _, id := range removed {
		g.eps[id] = nil
	}
	g.freeIDs = append(g.freeIDs, removed...)
}

// rebuildAddrMaps recomputes the live list (address order) and the
// by-IP map from the endpoints.
func (c *Core) rebuildAddrMaps() {
	g := &c.reg
	g.live = g.live[:0]
	clear(g.byIP)
	for _, e := range g.eps {
		if e == nil || e.removed {
			continue
		}
		g.live = append(g.live, e.id)
		if host, _, err := net.SplitHostPort(e.addr); err == nil {
			g.byIP[host] = append(g.byIP[host], e)
		}
	}
	sort.Slice(g.live, func(i, j int) bool { return g.eps[g.live[i]].addr < g.eps[g.live[j]].addr })
}

// resolveAllow turns the ticket's allow-list into endpoints and decides
// whether the request is pinned (SPEC §4: a one-endpoint subset is a pin).
func (c *Core) resolveAllow(r *Request) error {
	t := r.Ticket
	if !t.HasAllow {
		return nil
	}
	eps := make([]*endpoint, 0, len(t.Allow))
	for _, a := range t.Allow {
		if e, ok := c.reg.byAddr[a]; ok {
			eps = appendUnique(eps, e)
			continue
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			for _, e := range c.reg.byIP[a] {
				eps = appendUnique(eps, e)
			}
		}
	}
	if len(eps) == 0 {
		return &NoEndpointError{Filter: "subset hint names no known endpoint"}
	}
	r.allow = eps
	if len(eps) == 1 {
		r.pinned = eps[0].id
	}
	return nil
}

func appendUnique(eps []*endpoint, e *endpoint) []*endpoint {
	for _, x := range eps {
		if x == e {
			return eps
		}
	}
	return append(eps, e)
}

// candidate is one endpoint a request may go to now, as the walk that
// found it saw it: the prompt tokens it probably has cached (0 without a
// prefix snapshot) and whether it is busy for the class judged. It names
// the endpoint by id: a candidate is live, and no SetEndpoints comes
// between a walk and the decision that reads it, so c.reg.eps[id] is the
// endpoint (and the set holds no pointer for the collector to scan).
type candidate struct {
	id     drr.EndpointID
	busy   bool
	cached uint64
}

// candidateSet is what one walk over a request's endpoints found: the
// eligible ones, in walk order, and the filters that dropped the others.
// The verdict, the pick and the 503 of one decision are all read from the
// same set.
type candidateSet struct {
	eps []candidate
	// best is the most cached tokens of any candidate: the cost snapshot's
	// Cached (SPEC §1).
	best uint64
	// busy counts the candidates busy for the class judged.
	busy int
	// ranked: some live endpoint of the walk was inside the request's
	// data-parallel ranks; overloaded: one of those was past the overload
	// filter. They name the filter of a 503 when no candidate is left.
	ranked, overloaded bool

	// In a pool with roles, a walk for a request whose stage is decided is
	// split (roles.go): eps keeps the stage the busy test judges, dec the
	// decode stage of a disaggregating request (disagg), found the
	// candidates before the split.
	split, disagg bool
	dec           []candidate
	found         int
}

// candidates is the package's one eligibility walk (SPEC §5): it refills
// the core's scratch set with the endpoints r may go to now, in its
// allow-list's order or the live endpoints' address order, each with its
// prefix overlap when hashes is not empty, and records what the filters
// dropped. Eligibility is the same for queued and direct requests: a live
// endpoint, inside the request's data-parallel ranks, past the overload
// filter, not tainted unless the request is pinned to it.
//
// With a class index each candidate is judged for it on the way (see
// judge); admission passes noClass, as its class depends on the set's
// cached tokens, and judges once it has resolved it. The set stays valid
// until the next walk. O(|allow|) with a subset hint, else O(E), plus the
// index's overlap per candidate.
func (c *Core) candidates(now int64, r *Request, hashes []uint64, class int) *candidateSet {
	var rule *policy.BusyTest
	if class != noClass {
		rule = &c.pol.Busy[class]
	}
	s := &c.set
	c.walk(s, r, rule)
	if len(hashes) > 0 {
		t := r.Ticket
		for i := range s.eps {
			x := &s.eps[i]
			x.cached = cachedTokens(c.index.Overlap(int(x.id), hashes, now), t)
			s.best = max(s.best, x.cached)
		}
	}
	c.splitByStage(s, r)
	return s
}

// walk is candidates' loop over the endpoints, without the overlaps. It
// runs per endpoint on every admission and every probe of a queued head,
// so it is a function of its own with no call on its path (append grows
// the scratch only while it is new): a call in the loop, such as the
// index's, makes the compiler spill its registers on every endpoint.
func (c *Core) walk(s *candidateSet, r *Request, rule *policy.BusyTest) {
	s.eps = s.eps[:0]
	s.best, s.busy, s.ranked, s.overloaded = 0, 0, false, false
	s.split, s.disagg, s.dec = false, false, s.dec[:0]
	pinned := r.pinned != drr.NoEndpoint
	for i, n := 0, c.numCandidates(r); i < n; i++ {
		e := c.candidateAt(r, i)
		if e.removed || !inRanks(e, r.Ticket) {
			continue
		}
		s.ranked = true
		if c.overloaded(e) {
			s.overloaded = true
			continue
		}
		if e.tainted && !pinned {
			continue
		}
		x := candidate{id: e.id}
		if rule != nil && e.busyUnder(rule) {
			x.busy = true
			s.busy++
		}
		s.eps = append(s.eps, x)
	}
}

// numCandidates and candidateAt index the endpoints a request may go to:
// its allow-list, or every live endpoint.
func (c *Core) numCandidates(r *Request) int {
	if r.allow != nil {
		return len(r.allow)
	}
	return len(c.reg.live)
}

func (c *Core) candidateAt(r *Request, i int) *endpoint {
	if r.allow != nil {
		return r.allow[i]
	}
	return c.reg.eps[c.reg.live[i]]
}

func inRanks(e *endpoint, t *Ticket) bool {
	return !t.HasRanks || (e.rank >= t.RankLo && e.rank <= t.RankHi)
}

// overloaded is the overload filter: the engine's own queue is past
// MaxEngineQueue. Stale metrics do not trip it (staleness makes an
// endpoint busy instead), so an endpoint is never skipped on old numbers.
func (c *Core) overloaded(e *endpoint) bool {
	return c.opts.MaxEngineQueue > 0 && !e.stale && e.waiting > c.opts.MaxEngineQueue
}

// noClass is the class argument of a walk whose class is not known yet.
const noClass = -1

// busy is the class's busy test (SPEC §5) on the endpoint's prefill load,
// ours plus the unseen estimate; an endpoint with stale metrics is busy.
func (c *Core) busy(e *endpoint, class int) bool {
	return e.busyUnder(&c.pol.Busy[class])
}

// busyUnder is the busy test under one class's rule (see busy); an auto
// rule reads the endpoint's own threshold.
func (e *endpoint) busyUnder(rule *policy.BusyTest) bool {
	if rule.Auto {
		return e.stale || e.load() > e.auto.Threshold()
	}
	return e.stale || rule.EndpointBusy(e.load(), e.maxBatched)
}

// judge is the busy test of SPEC §5 over a candidate set walked without
// a class: it marks each candidate busy or not for class (what the pick
// then reads) and returns the shared verdict.
func (c *Core) judge(s *candidateSet, class int) drr.Verdict {
	s.busy = 0
	rule := &c.pol.Busy[class]
	for i := range s.eps {
		x := &s.eps[i]
		x.busy = c.reg.eps[x.id].busyUnder(rule)
		if x.busy {
			s.busy++
		}
	}
	return c.verdict(s, class)
}

// verdict is the shared verdict of a judged candidate set.
func (c *Core) verdict(s *candidateSet, class int) drr.Verdict {
	if len(s.eps) == 0 || s.stageMissing() != "" {
		return drr.Unroutable
	}
	if c.pol.Busy[class].SharedBlocked(s.busy, len(s.eps)) {
		return drr.Blocked
	}
	return drr.Ready
}

// noEndpoint names the filter that left r without an endpoint, from the
// walk that found no candidate for it.
func (c *Core) noEndpoint(r *Request, s *candidateSet) error {
	if st := s.stageMissing(); st != "" {
		return stageError(st)
	}
	switch {
	case len(c.reg.live) > 0 && !s.ranked && r.Ticket.HasRanks:
		return &NoEndpointError{Filter: fmt.Sprintf("no endpoint has a data-parallel rank in %d-%d", r.Ticket.RankLo, r.Ticket.RankHi)}
	case s.overloaded:
		return &NoEndpointError{Filter: fmt.Sprintf("overload filter: the engine queue of every candidate endpoint is past --max-engine-queue=%d", c.opts.MaxEngineQueue)}
	case len(c.reg.live) == 0:
		return &NoEndpointError{Filter: "the pool has no ready endpoint"}
	case r.allow != nil:
		return &NoEndpointError{Filter: "no endpoint of the subset hint is available"}
	default:
		return &NoEndpointError{Filter: "every endpoint is tainted"}
	}
}

// prober answers pkg/drr's questions about heads of line.
type prober struct{ c *Core }

// Shared judges a queued head on a fresh walk: the endpoints changed since
// it was admitted. No prefix snapshot: the verdict does not read it.
func (p prober) Shared(class int, it *drr.Item) drr.Verdict {
	return p.c.verdict(p.c.candidates(0, it.Payload.(*Request), nil, class), class)
}

func (p prober) Lane(class int, ep drr.EndpointID) drr.Verdict {
	e := p.c.reg.byID(ep)
	if e == nil || e.removed || p.c.overloaded(e) {
		return drr.Unroutable
	}
	if p.c.busy(e, class) {
		return drr.Blocked
	}
	return drr.Ready
}
