package sched

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/laneway-dev/laneway/pkg/affinity"
	"github.com/laneway-dev/laneway/pkg/drr"
	"github.com/laneway-dev/laneway/pkg/policy"
)

// Options configure a Core.
type Options struct {
	// MaxFallbacks is how many further endpoints follow the pick in a
	// grant, in the order the picker prefers them.
	MaxFallbacks int
	// Chooser chooses among eligible endpoints; nil means NewLeastLoaded(1).
	Chooser Chooser
	// ExpectMetrics makes every endpoint count as stale (busy, and ranked
	// last) until SetMetrics delivers fresh metrics for it: with scraping
	// on, an endpoint whose load is unknown must not look idle.
	ExpectMetrics bool
	// DefaultEngine is the engine of endpoints whose Endpoint.Engine is
	// empty or unknown.
	DefaultEngine policy.Engine
	// Prefix turns on the prefix-cache index; nil leaves Ticket.Cached as
	// the parser set it.
	Prefix *PrefixOptions
	// MaxEngineQueue is SPEC §5's overload filter: an endpoint whose engine
	// reported more waiting requests than this is skipped, like a tainted
	// one, until a scrape shows its queue back within the bound. When it
	// leaves a request no endpoint, the answer is a 503 naming the filter.
	// 0 turns the filter off.
	MaxEngineQueue int
	// Releaser receives the response-path events of the grants this core
	// gives (Grant.FirstByte, Grant.Done), from the streams' goroutines; it
	// hands them to the core's owner, which applies them with Release. Nil
	// drops them: a driver that calls Release itself (the simulator) needs
	// none.
	Releaser Releaser
	// DisaggregateAboveUncachedTokens is the pool's disaggregation
	// threshold, for the classes that set none (policy.Disaggregation): in
	// a pool with prefill-only endpoints, a request whose uncached prompt
	// tokens are above it is prefilled on a prefill pod (roles.go).
	DisaggregateAboveUncachedTokens uint64
	// DisableLoRAAffinity turns off the LoRA tier of the pick (lora.go):
	// adapter requests then go where the chooser alone puts them.
	DisableLoRAAffinity bool
}

// PrefixOptions configure the prefix-cache index.
type PrefixOptions struct {
	// BlockSize is the hashing block size in tokens until an engine
	// reports a larger one (0 means DefaultBlockSize).
	BlockSize int
	// Index configures the per-endpoint index (capacity, TTL).
	Index affinity.IndexOptions
}

// DefaultBlockSize is the prefix hashing block size when nothing else is
// known: vLLM's default KV block size.
const DefaultBlockSize = 16

// MaxEngineBlockSize is the largest engine KV block size, in tokens, that
// raises the hashing block size (vLLM's and TRT-LLM's pages are 16 to 128
// tokens). One endpoint's report could otherwise set the pool's hashing
// block size to anything: at a billion tokens no prompt holds a whole
// block and the prefix index finds nothing for any endpoint.
const MaxEngineBlockSize = 256

// unseenRequestSeed is the prompt size assumed for a request seen waiting
// in an engine before this picker dispatched any request of its own.
const unseenRequestSeed = 1024

// maxOutputTokens bounds a ticket's OutputTokens as the core reads it: no
// engine generates more than a context of a few million tokens, and a
// client's max_tokens of 2^63 must not overflow the mean.
const maxOutputTokens = 1 << 24

// Core is the scheduling state machine (see the package documentation).
// The zero value is not usable; create one with New. One goroutine owns it.
type Core struct {
	opts     Options
	pol      *Policy
	q        *drr.Scheduler
	probe    prober
	draining bool

	reg registry

	// out collects the decisions Drain returns next; outSpare is the
	// buffer handed out by the previous Drain, reused by the next one.
	out, outSpare []Leave

	set   candidateSet // scratch: the last walk's candidates (candidates)
	cands []Candidate  // scratch for picks: the set as the Chooser sees it
	order []int        // scratch for picks

	decOrder   []int        // scratch for decode picks (roles.go)
	decLoads   []decodeLoad // scratch for decode picks
	decodeTurn uint64       // rotates ties between equally loaded decode pods

	adapters map[string]struct{} // adapter names endpoints reported (lora.go)

	// drainingEps are the endpoints whose ledger holds grants or whose
	// engine queue showed unseen requests (ledger.go, predict).
	drainingEps []*endpoint

	index      *affinity.Index // the prefix-cache index; nil: none
	baseBS     int             // PrefixOptions.BlockSize
	hashBS     int             // the block size parsers should hash at
	meanPrompt uint64          // moving mean of dispatched uncached tokens
	meanOutput uint64          // moving mean of dispatched OutputTokens that were given (0: none yet)
	hasAuto    bool            // some class of the policy has an auto threshold
}

// Request is one request inside the core, from Admit until its Leave. The
// driver allocates it (it may embed it in its own per-request state) and
// must not change it or reuse it before the request has left.
type Request struct {
	// Ticket is what the request is; the core sets its Class and Cached.
	Ticket *Ticket
	// Owner is the driver's handle for the request (the waiting stream);
	// the core never reads it.
	Owner any

	item    *drr.Item
	allow   []*endpoint // nil: every live endpoint
	pinned  drr.EndpointID
	arrival int64
	state   reqState
	grant   *Grant
	stage   stage // whether it disaggregates (roles.go)
}

type reqState uint8

const (
	stateNew reqState = iota
	stateQueued
	stateLeft
)

// Reset prepares r for a new request (or for recycling).
func (r *Request) Reset(t *Ticket, owner any) {
	*r = Request{Ticket: t, Owner: owner, pinned: drr.NoEndpoint}
}

// Left reports whether the request has left the core (its Leave was
// produced).
func (r *Request) Left() bool { return r.state == stateLeft }

// Grant returns the request's grant once it left granted, else nil.
func (r *Request) Grant() *Grant { return r.grant }

// New returns a core scheduling with pol.
func New(pol *Policy, opts Options) (*Core, error) {
	if err := pol.Validate(); err != nil {
		return nil, err
	}
	q, err := drr.New(pol.Classes)
	if err != nil {
		return nil, fmt.Errorf("building scheduler: %w", err)
	}
	c := &Core{opts: opts, pol: pol, q: q, reg: newRegistry(), hasAuto: pol.hasAuto()}
	if c.opts.Chooser == nil {
		// Seeded, not the zero value's global generator: the core's
		// decisions are a function of its inputs (doc.go).
		c.opts.Chooser = NewLeastLoaded(1)
	}
	c.probe = prober{c}
	c.meanPrompt = unseenRequestSeed
	c.baseBS = DefaultBlockSize
	if p := opts.Prefix; p != nil {
		c.index = affinity.NewIndex(p.Index)
		if p.BlockSize > 0 {
			c.baseBS = p.BlockSize
		}
	}
	c.hashBS = c.baseBS
	return c, nil
}

// Len returns the number of queued requests.
func (c *Core) Len() int { return c.q.Len() }

// BlockSize is the block size, in tokens, at which request parsers should
// hash prompts for the prefix index: PrefixOptions.BlockSize, or the
// largest KV block size an endpoint reports if that is larger.
func (c *Core) BlockSize() int { return c.hashBS }

// NextDeadline returns the earliest time the driver should call Drain:
// when a queued request's wait budget runs out, or, while requests are
// queued, when the engine is predicted to finish a prefill the picker
// was not told about (ledger.go).
func (c *Core) NextDeadline() (at int64, ok bool) {
	at, ok = c.q.NextExpiry()
	if c.q.Len() == 0 {
		return at, ok
	}
	if p, pok := c.nextPrediction(); pok && (!ok || p < at) {
		at, ok = p, true
	}
	return at, ok
}

// ClassName returns the name of class i of the policy in force ("" when
// out of range).
func (c *Core) ClassName(i int) string {
	if i >= 0 && i < len(c.pol.Classes) {
		return c.pol.Classes[i].Name
	}
	return ""
}

// Admit takes a new request at now: it takes the cost snapshot and
// resolves the class (SPEC §1, §2), applies eligibility and admission
// (SPEC §5), and either decides it at once (a grant or an error, both in
// the next Drain's Leaves) or queues it. r must be fresh (Reset).
//
// One walk over the request's endpoints builds its candidate set
// (eligibility and prefix overlap); the class is resolved once, after the
// snapshot, since the cached tokens pick the cache bucket; the busy test,
// the verdict and a direct grant's pick all read that same set.
func (c *Core) Admit(now int64, r *Request) {
	if r.state != stateNew {
		panic("sched: Admit of a request already admitted")
	}
	if c.draining {
		c.reject(r, ErrShuttingDown, ReasonShuttingDown)
		return
	}
	t := r.Ticket
	c.pol.entitle(t) // resolution reads the tenant's rights
	if err := c.resolveAllow(r); err != nil {
		t.Class = c.pol.resolve(t) // the answer names a class
		c.reject(r, err, ReasonNoEndpoints)
		return
	}
	hashes := c.cacheableBlocks(t)
	s := c.candidates(now, r, hashes, noClass)
	c.resolveStage(r, s, len(hashes) > 0)
	v := c.judge(s, t.Class)
	if v == drr.Unroutable {
		c.reject(r, c.noEndpoint(r, s), ReasonNoEndpoints)
		return
	}
	r.arrival = now - max(0, int64(t.Waited))
	item, err := c.q.Offer(drr.Request{
		Class:          int32(t.Class),
		Pinned:         r.pinned,
		RawISL:         t.RawISL,
		Cached:         t.Cached,
		Priority:       t.EffectivePriority(),
		StrictPriority: t.EffectiveStrict(),
		Arrival:        r.arrival,
		Payload:        r,
	}, t.Rights.Tenant, len(c.reg.live), v == drr.Blocked)
	if err != nil {
		reason := ReasonQueueLimit
		var rej *drr.Rejection
		if errors.As(err, &rej) {
			reason = rejectionReason(rej)
		}
		c.reject(r, err, reason)
		return
	}
	if item == nil {
		c.grant(now, r, false, s)
		return
	}
	r.item = item
	r.state = stateQueued
}

// Cancel is the caller giving up on r: a queued request leaves at once
// (Leave with ErrCancelled); a request granted but never received by its
// caller has its grant released. It reports whether r was still queued.
func (c *Core) Cancel(r *Request) bool {
	switch r.state {
	case stateQueued:
		if c.q.Remove(r.item) {
			r.item = nil
			c.reject(r, ErrCancelled, ReasonCancelled)
			return true
		}
	case stateLeft:
		if g := r.grant; g != nil && g.done.CompareAndSwap(false, true) {
			c.releaseUnsent(g)
		}
	}
	return false
}

// Drain dispatches every queued request that can leave at now (SPEC §5:
// draining is repeated until nothing is dispatchable) and returns every
// decision since the previous Drain, in the order they were taken. The
// slice is valid until the next Drain. It first releases the grants the
// engine is predicted to have prefilled by now (ledger.go).
func (c *Core) Drain(now int64) []Leave {
	c.predict(now)
	for c.q.Len() > 0 {
		it, out := c.q.Pop(now, c.probe)
		if out == drr.None {
			break
		}
		r := it.Payload.(*Request)
		r.item = nil
		switch out {
		case drr.Dispatch:
			// The endpoints changed since admission: a fresh walk, with
			// the prefix overlap the pick ranks by.
			s := c.candidates(now, r, c.cacheableBlocks(r.Ticket), r.Ticket.Class)
			c.grant(now, r, true, s)
		case drr.Expired:
			cfg := c.pol.Classes[it.Class]
			c.reject(r, &ShedError{
				Class:  cfg.Name,
				Waited: time.Duration(now - r.arrival),
				Budget: cfg.WaitBudget,
			}, ReasonShed)
		case drr.NoRoute:
			c.reject(r, c.noEndpoint(r, c.candidates(now, r, nil, noClass)), ReasonNoEndpoints)
		}
	}
	out := c.out
	c.out = c.outSpare[:0]
	c.outSpare = out
	return out
}

// leave records r's one decision.
func (c *Core) leave(r *Request, l Leave) {
	if r.state == stateLeft {
		panic("sched: a request left twice")
	}
	r.state = stateLeft
	l.Req = r
	l.Class = c.ClassName(r.Ticket.Class)
	l.Tenant = r.Ticket.Rights.Name
	l.Weight = max(1, r.Ticket.Rights.Weight)
	l.Uncached = r.Ticket.Uncached()
	c.out = append(c.out, l)
}

func (c *Core) reject(r *Request, err error, reason string) {
	c.leave(r, Leave{Err: err, Reason: reason})
}

// SetPolicy swaps the class table without losing or reordering queued
// requests: each is resolved again with the new policy. An invalid policy
// is refused and the old one stays in force.
func (c *Core) SetPolicy(p *Policy) error {
	if err := p.Validate(); err != nil {
		return err
	}
	err := c.q.SetClasses(p.Classes, func(it *drr.Item) (int, drr.Tenant) {
		t := it.Payload.(*Request).Ticket
		p.entitle(t)
		t.Class = p.resolve(t)
		// The new rights' caps order the request from now on.
		it.Priority, it.StrictPriority = t.EffectivePriority(), t.EffectiveStrict()
		return t.Class, t.Rights.Tenant
	})
	if err != nil {
		return fmt.Errorf("applying policy: %w", err)
	}
	c.pol, c.hasAuto = p, p.hasAuto()
	// Busy rules changed: every lane verdict is stale.
	for _, id := range c.reg.live {
		c.q.EndpointChanged(id)
	}
	return nil
}

// Shutdown stops admitting: every queued request leaves with
// ErrShuttingDown (in the next Drain's Leaves), and so does every later
// Admit. Granted requests keep their grants.
func (c *Core) Shutdown(now int64) {
	c.draining = true
	for _, e := range c.reg.eps {
		if e != nil {
			c.q.EndpointChanged(e.id)
		}
	}
	for c.q.Len() > 0 {
		it, out := c.q.Pop(now, refuseAll{})
		if out == drr.None {
			break // cannot happen: refuseAll makes every head leave
		}
		r := it.Payload.(*Request)
		r.item = nil
		c.reject(r, ErrShuttingDown, ReasonShuttingDown)
	}
}

// refuseAll is the probe used at shutdown: every head leaves as
// Unroutable, so the whole queue empties without charging anything.
type refuseAll struct{}

func (refuseAll) Shared(int, *drr.Item) drr.Verdict    { return drr.Unroutable }
func (refuseAll) Lane(int, drr.EndpointID) drr.Verdict { return drr.Unroutable }

// Snapshot returns the queue and endpoint state (for metrics and status).
func (c *Core) Snapshot() Snapshot {
	s := Snapshot{Classes: c.q.Stats(), Queued: c.q.Len()}
	for _, id := range c.reg.live {
		e := c.reg.eps[id]
		es := EndpointSnapshot{
			Addr: e.addr, ActivePrefill: e.activePrefill, InFlight: e.inFlight, Tainted: e.tainted,
			Stale: e.stale, UnseenWaiting: e.unseenWaiting, UnseenPrefill: e.unseenPrefill,
			EngineWaiting: e.waiting, MaxBatchedTokens: e.maxBatched, Busy: c.busyEverywhere(e),
			Role: e.role, AwaitingEngine: e.led.len(), OthersOnTheirWay: e.led.othersOnTheirWay(),
			ArrivalShare: e.led.share, PrefillRate: e.led.rate,
		}
		if c.hasAuto {
			es.AutoThreshold, es.HasAuto = e.auto.Threshold(), true
			es.ExpectedOutput = e.auto.Output(c.askedOutput(e))
		}
		if c.index != nil {
			es.IndexTokens = c.index.Stats(int(id)).Tokens
		}
		s.Endpoints = append(s.Endpoints, es)
	}
	return s
}

// AutoThreshold is the auto threshold of the endpoint at addr (SPEC §5);
// ok is false for an unknown address or a policy without auto classes.
func (c *Core) AutoThreshold(addr string) (threshold uint64, ok bool) {
	e, found := c.reg.byAddr[addr]
	if !found || !c.hasAuto {
		return 0, false
	}
	return e.auto.Threshold(), true
}

// busyEverywhere reports whether e is busy for every class that queues
// (stale counts as busy): no queued request can go there now.
func (c *Core) busyEverywhere(e *endpoint) bool {
	if e.stale {
		return true
	}
	any := false
	for i := range c.pol.Classes {
		if !c.pol.Classes[i].Queueing {
			continue
		}
		if !c.busy(e, i) {
			return false
		}
		any = true
	}
	return any
}

// TopTenants returns up to n tenants of class i with the most queued raw
// prompt tokens, most first (ties by name). O(T log n) for T tenants.
func (c *Core) TopTenants(i, n int) []drr.TenantStats {
	if i < 0 || i >= c.q.NumClasses() || n <= 0 {
		return nil
	}
	var top []drr.TenantStats
	c.q.Tenants(i, func(t drr.TenantStats) {
		j, _ := slices.BinarySearchFunc(top, t, tenantOrder)
		if j >= n {
			return
		}
		top = slices.Insert(top, j, t)
		if len(top) > n {
			top = top[:n]
		}
	})
	return top
}

// tenantOrder sorts tenants by queued raw tokens, most first, then name.
func tenantOrder(a, b drr.TenantStats) int {
	if a.PendingRawISL != b.PendingRawISL {
		return cmp.Compare(b.PendingRawISL, a.PendingRawISL)
	}
	return cmp.Compare(a.Name, b.Name)
}
