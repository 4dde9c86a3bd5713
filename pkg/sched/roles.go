package sched

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/laneway-dev/laneway/pkg/drr"
)

// This file holds prefill/decode disaggregation (SPEC §5, Roles): the
// endpoint roles, the per-request decision to disaggregate, the split of
// one walk's candidate set into the prefill stage and the decode stage, and
// the decode pod's pick. A pool without prefill-only endpoints never
// reaches any of it past a counter check, so it schedules exactly as a
// pool without roles.

// Role is what an endpoint serves in a disaggregated pool (the pod label
// llm-d.ai/role).
type Role uint8

// Roles. The zero value is prefill-decode: an endpoint without a role
// serves whole requests, as every endpoint does in a pool without roles.
const (
	// RolePrefillDecode serves whole requests, and is a decode pod for
	// disaggregated ones (label values prefill-decode and both).
	RolePrefillDecode Role = iota
	// RolePrefill only prefills: it takes the prefill stage of
	// disaggregated requests, never a whole request.
	RolePrefill
	// RoleDecode decodes disaggregated requests and serves whole requests
	// that do not disaggregate.
	RoleDecode
)

// Label values of the roles, as llm-d spells them.
const (
	RoleNamePrefill       = "prefill"
	RoleNameDecode        = "decode"
	RoleNamePrefillDecode = "prefill-decode"
	// RoleNameBoth is the deprecated spelling of prefill-decode.
	RoleNameBoth = "both"
)

// String returns the role's label value.
func (r Role) String() string {
	switch r {
	case RolePrefill:
		return RoleNamePrefill
	case RoleDecode:
		return RoleNameDecode
	case RolePrefillDecode:
		return RoleNamePrefillDecode
	}
	return fmt.Sprintf("Role(%d)", uint8(r))
}

// ParseRole reads a role label value: prefill, decode, prefill-decode or
// its deprecated alias both (any case, surrounding space ignored); empty is
// prefill-decode. An unknown value is prefill-decode with an error the
// caller logs as a warning: an endpoint with a mistyped label still serves
// whole requests rather than leaving the pool.
func ParseRole(s string) (Role, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", RoleNamePrefillDecode, RoleNameBoth:
		return RolePrefillDecode, nil
	case RoleNamePrefill:
		return RolePrefill, nil
	case RoleNameDecode:
		return RoleDecode, nil
	}
	return RolePrefillDecode, fmt.Errorf("unknown role %q (want prefill, decode or prefill-decode); serving it as prefill-decode", s)
}

// stage is what a request's admission decided about disaggregation; the
// walks of its probes and its grant split their candidate sets by it.
type stage uint8

const (
	// stageUndecided: the admission's own walk, before the decision.
	stageUndecided stage = iota
	// stageWhole: no roles applied at the admission (the pool had no
	// prefill pod, or the request is pinned): every eligible endpoint.
	// Should prefill pods join while an unpinned one waits, it is served
	// whole by the decode stage (prefill-only pods never serve whole
	// requests).
	stageWhole
	// stageShort: local, its uncached tokens are at or below the class's
	// threshold.
	stageShort
	// stageNoPrefill: it would disaggregate, but no prefill pod is
	// eligible for it: local.
	stageNoPrefill
	// stageDisagg: prefill on a prefill pod, decode on a decode pod.
	stageDisagg
)

// PDDecision is a grant's disaggregation decision (Grant.PD); its String
// is the laneway_pd_decisions_total decision label.
type PDDecision uint8

// Disaggregation decisions.
const (
	// PDNone: a pool without prefill pods, or a pinned request: no
	// decision.
	PDNone PDDecision = iota
	// PDDisaggregated: prefilled on Grant.Prefiller, decoded on the pick.
	PDDisaggregated
	// PDBelowThreshold: served whole by a decode pod, as its uncached
	// tokens are at or below the class's disaggregation threshold.
	PDBelowThreshold
	// PDNoPrefillEndpoint: it would have disaggregated, but no prefill
	// pod was eligible: served whole by a decode pod.
	PDNoPrefillEndpoint
	// NumPDDecisions bounds the decisions, for arrays indexed by them.
	NumPDDecisions
)

// String returns the decision's metric label ("" for PDNone).
func (d PDDecision) String() string {
	switch d {
	case PDDisaggregated:
		return "disaggregated"
	case PDBelowThreshold:
		return "below_threshold"
	case PDNoPrefillEndpoint:
		return "no_prefill_endpoint"
	}
	return ""
}

// PrefillerHeader is the request header that names the prefill pod
// ("host:port") of a disaggregated request to the decode pod's sidecar,
// llm-d's convention.
const PrefillerHeader = "x-prefiller-host-port"

// disaggregateAbove is class's disaggregation threshold: the class's own,
// else the pool's default.
func (c *Core) disaggregateAbove(class int) uint64 {
	if d := c.pol.Disaggregate; class < len(d) && d[class].Set {
		return d[class].AboveUncached
	}
	return c.opts.DisaggregateAboveUncachedTokens
}

// roles reports whether the pool has prefill-only endpoints: only then do
// requests disaggregate and do walks split by role.
func (c *Core) roles() bool { return c.reg.prefillPods > 0 }

// countRoles recounts the live prefill-only endpoints.
func (c *Core) countRoles() {
	n := 0
	for _, id := range c.reg.live {
		if c.reg.eps[id].role == RolePrefill {
			n++
		}
	}
	c.reg.prefillPods = n
}

// resolveStage takes the cost snapshot from the admission's walk, resolves
// the class and decides whether the request disaggregates, then splits the
// set into the stage its busy test judges (SPEC §1, §2, §5).
//
// Without roles (or pinned) the snapshot is the best overlap of the whole
// set and the class follows from it, as it always has. With roles the
// snapshot is first the best overlap over the eligible prefill pods and the
// class is resolved from it; the request disaggregates when its uncached
// tokens are above that class's threshold. Otherwise the snapshot is taken
// again over the decode stage (decode and prefill-decode endpoints), where
// the request will be prefilled, and the class resolved from that: the
// class a request queues in always matches the snapshot it is charged by.
func (c *Core) resolveStage(r *Request, s *candidateSet, snapshot bool) {
	t := r.Ticket
	if !c.roles() || r.pinned != drr.NoEndpoint {
		r.stage = stageWhole
		if snapshot {
			t.Cached = s.best
		}
		t.Class = c.pol.resolve(t)
		return
	}
	var bestPre, bestLocal uint64
	pre := 0
	for _, x := range s.eps {
		if c.reg.eps[x.id].role == RolePrefill {
			pre++
			bestPre = max(bestPre, x.cached)
		} else {
			bestLocal = max(bestLocal, x.cached)
		}
	}
	r.stage = stageNoPrefill
	if pre > 0 {
		if snapshot {
			t.Cached = bestPre
		}
		t.Class = c.pol.resolve(t)
		if t.Uncached() > c.disaggregateAbove(t.Class) {
			r.stage = stageDisagg
		} else {
			r.stage = stageShort
		}
	}
	if r.stage != stageDisagg {
		if snapshot {
			t.Cached = bestLocal
		}
		t.Class = c.pol.resolve(t)
	}
	c.split(s, r)
}

// split divides a walked set by the request's stage: s.eps keeps the stage
// the busy test judges and the chooser ranks (the prefill pods of a
// disaggregating request; else the decode and prefill-decode endpoints)
// and s.dec the decode stage of a disaggregating one. A disaggregating
// request with no eligible prefill pod left is served whole (its decision
// becomes no_prefill_endpoint for this walk). The busy count and best
// overlap are recounted for s.eps. Walk order is kept in both parts.
func (c *Core) split(s *candidateSet, r *Request) {
	s.found = len(s.eps)
	s.dec = s.dec[:0]
	s.disagg = false
	if r.stage == stageDisagg {
		for _, x := range s.eps {
			if c.reg.eps[x.id].role == RolePrefill {
				s.disagg = true
				break
			}
		}
	}
	w := 0
	for _, x := range s.eps {
		prefill := c.reg.eps[x.id].role == RolePrefill
		switch {
		case s.disagg && !prefill:
			s.dec = append(s.dec, x)
		case s.disagg || !prefill:
			s.eps[w] = x
			w++
		}
	}
	s.eps = s.eps[:w]
	s.busy, s.best = 0, 0
	for _, x := range s.eps {
		if x.busy {
			s.busy++
		}
		s.best = max(s.best, x.cached)
	}
	s.split = true
}

// splitByStage is candidates' last step for a request whose stage is
// decided, in a pool with roles.
func (c *Core) splitByStage(s *candidateSet, r *Request) {
	if c.roles() && r.stage != stageUndecided && r.pinned == drr.NoEndpoint {
		c.split(s, r)
	}
}

// stageMissing names the stage a split set cannot serve r in: "decode"
// when a disaggregating request has prefill pods but no decode stage, or a
// local one no decode or prefill-decode endpoint; "" when it can.
func (s *candidateSet) stageMissing() string {
	switch {
	case !s.split:
		return ""
	case s.disagg && len(s.dec) == 0, !s.disagg && len(s.eps) == 0 && s.found > 0:
		return "decode"
	}
	return ""
}

// stageError is the 503 of a request whose walk found endpoints but not
// in the stage it needs.
func stageError(stage string) error {
	return &NoEndpointError{Filter: "no " + stage + " stage endpoint: no eligible endpoint with role decode or prefill-decode (prefill-only endpoints do not serve whole requests)"}
}

// pdDecision is the Grant.PD of a grant from set s.
func pdDecision(r *Request, s *candidateSet) PDDecision {
	switch {
	case !s.split:
		return PDNone
	case s.disagg:
		return PDDisaggregated
	case r.stage == stageShort:
		return PDBelowThreshold
	}
	return PDNoPrefillEndpoint
}

// decodeStage completes a disaggregated grant g, whose pick (and charge)
// is the prefill pod: it chooses the decode pod by decode load, makes it
// the destination (with ordered fallbacks), names the prefill pod in
// g.Prefiller(), and counts the request in flight on the decode pod. The
// prefill pod keeps the prefill charge and the in-flight count until the
// first response byte (handOver).
func (c *Core) decodeStage(g *Grant, r *Request, s *candidateSet) {
	g.PD = pdDecision(r, s)
	if !s.disagg {
		return
	}
	order := c.decodeOrder(r.Ticket, s.dec)
	n := min(1+c.opts.MaxFallbacks, len(order))
	d := c.reg.eps[s.dec[order[0]].id]
	x := g.extra()
	x.prefiller, x.dec = g.ep.addr, d
	if n == 1 {
		g.pick[0] = d.addr
		g.Endpoints = g.pick[:1:1]
	} else {
		g.Endpoints = make([]string, n)
		for i := range n {
			g.Endpoints[i] = c.reg.eps[s.dec[order[i]].id].addr
		}
	}
	g.Engine = d.engine
	d.inFlight++
	d.sent++ // the engine counts the request among its arrivals too
	d.peakOurs = max(d.peakOurs, d.ours())
}

// handOver is a disaggregated grant's first response byte: the prefill
// pod's part is over (its prefill charge has just been returned), so it no
// longer counts the request in flight; the decode pod decodes it.
func (c *Core) handOver(g *Grant) {
	c.leavePrefill(g)
	g.x.dec.decoding++
}

// leavePrefill ends a disaggregated grant's stay on its prefill pod, at
// its first byte or, when the stream ends first, at its end (its charge
// may then stay in the prefill pod's ledger until the engine confirms the
// prefill). The decode pod's engine counts the prompt in its prompt-token
// counter too, when the KV cache has arrived: its ledger must not credit
// that to a grant of its own (ledger.go).
func (c *Core) leavePrefill(g *Grant) {
	if p := g.ep; p.inFlight > 0 {
		p.inFlight--
	}
	c.adapterDone(g, g.ep)
}

// decodeLoad is what orders decode pods: fresh metrics first, then those
// whose KV cache is not nearly full, then the fewest sequences (the larger
// of this picker's requests in flight there and the engine's running
// count), then the least KV-cache use.
type decodeLoad struct {
	stale, full bool
	tier        uint8 // the LoRA tier of an adapter request (lora.go), else 0
	seqs        int
	kv          float64
}

// kvFull is the KV-cache use at which a decode pod is ranked after every
// pod with room: a new sequence there would wait or preempt another.
const kvFull = 0.95

func (c *Core) decodeLoadOf(e *endpoint) decodeLoad {
	return decodeLoad{stale: e.stale, full: e.kvUsage >= kvFull, seqs: max(e.inFlight, e.running), kv: e.kvUsage}
}

func compareDecodeLoad(a, b decodeLoad) int {
	switch {
	case a.stale != b.stale:
		if a.stale {
			return 1
		}
		return -1
	case a.full != b.full:
		if a.full {
			return 1
		}
		return -1
	case a.tier != b.tier:
		return cmp.Compare(a.tier, b.tier)
	case a.seqs != b.seqs:
		return cmp.Compare(a.seqs, b.seqs)
	}
	return cmp.Compare(a.kv, b.kv)
}

// decodeOrder orders the decode stage best first (indexes of dec) by
// decode load; equal loads take turns, so equally loaded decode pods share
// the requests. O(D log D) for D decode candidates, into reused scratch.
func (c *Core) decodeOrder(t *Ticket, dec []candidate) []int {
	c.decOrder = c.decOrder[:0]
	c.decLoads = c.decLoads[:0]
	least := -1
	for i, x := range dec {
		e := c.reg.eps[x.id]
		c.decOrder = append(c.decOrder, i)
		c.decLoads = append(c.decLoads, c.decodeLoadOf(e))
		if !e.stale && (least < 0 || e.inFlight < least) {
			least = e.inFlight
		}
	}
	// An adapter request prefers decode pods where its adapter runs, then
	// those with room, under the balance guard of setLoRATiers.
	if a := c.adapterOf(t); a != "" {
		for i, x := range dec {
			if e := c.reg.eps[x.id]; least < 0 || e.inFlight <= balanced(least) {
				c.decLoads[i].tier = e.loraFit(a)
			} else {
				c.decLoads[i].tier = 2
			}
		}
	}
	// Rotate first, then sort stably: ties keep the rotated order.
	if n := len(c.decOrder); n > 1 {
		k := int(c.decodeTurn % uint64(n))
		c.decodeTurn++
		rotate(c.decOrder, k)
	}
	loads := c.decLoads
	slices.SortStableFunc(c.decOrder, func(a, b int) int { return compareDecodeLoad(loads[a], loads[b]) })
	return c.decOrder
}

// rotate moves the first k elements of x to its end, in place.
func rotate(x []int, k int) {
	slices.Reverse(x[:k])
	slices.Reverse(x[k:])
	slices.Reverse(x)
}
