package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/laneway-dev/laneway/pkg/drr"
	"github.com/laneway-dev/laneway/pkg/picker"
	"github.com/laneway-dev/laneway/pkg/podmetrics"
	"github.com/laneway-dev/laneway/pkg/policy"
)

// Options configure a Dispatcher.
type Options struct {
	// MaxFallbacks is how many further endpoints follow the pick in a
	// grant, in the order the picker prefers them.
	MaxFallbacks int
	// Observer receives per-request events; nil means none.
	Observer Observer
	// Log is the dispatcher's logger (nothing is logged per request below
	// verbosity 4).
	Log logr.Logger
	// Picker chooses among eligible endpoints; nil means least active
	// prefill tokens, then fewest in-flight requests.
	Picker Picker

	// ExpectMetrics makes every endpoint count as stale — busy, and ranked
	// last — until SetEndpointMetrics delivers fresh metrics for it: with
	// scraping on, an endpoint whose load is unknown must not look idle.
	ExpectMetrics bool
	// DefaultEngine is the engine of endpoints whose Endpoint.Engine is
	// empty or unknown.
	DefaultEngine policy.Engine
	// OnEndpoints, when set, is called with every endpoint set given to
	// SetEndpoints, on the caller's goroutine, after the loop has it (the
	// scraper starts and stops its targets here, in Kubernetes mode too).
	// It must not modify the slice.
	OnEndpoints func([]Endpoint)
	// Prefix turns on the prefix-cache index; nil leaves Ticket.Cached as
	// the parser set it.
	Prefix *PrefixOptions
	// MaxEngineQueue is SPEC §5's overload filter: an endpoint whose engine
	// reported more waiting requests than this is skipped, like a tainted
	// one, until a scrape shows its queue back within the bound. When it
	// leaves a request no endpoint, the answer is a 503 naming the filter.
	// 0 turns the filter off.
	MaxEngineQueue int
}

// PrefixOptions configure the prefix-cache index.
type PrefixOptions struct {
	// BlockSize is the hashing block size in tokens until an engine
	// reports a larger one (0 means DefaultBlockSize). BlockSize() returns
	// the current value for the request parser.
	BlockSize int
	// Index configures the per-endpoint index (capacity, TTL).
	Index picker.IndexOptions
}

// DefaultBlockSize is the prefix hashing block size when nothing else is
// known: vLLM's default KV block size.
const DefaultBlockSize = 16

// unseenRequestSeed is the prompt size assumed for a request seen waiting
// in an engine before this picker dispatched any request of its own.
const unseenRequestSeed = 1024

// Dispatcher is the single owner of the DRR state and endpoint accounting.
// Create it with New, start Run on one goroutine, then call Acquire from
// any number of request goroutines.
type Dispatcher struct {
	cmds  chan command
	done  chan struct{} // closed when Run returns
	start time.Time
	opts  Options
	obs   Observer

	// Response-path events (Grant.FirstByte, Grant.Done) go to a mailbox
	// instead of the command channel: the loop applies them before every
	// command it handles, so admission and snapshots always see current
	// accounting, and a release wakes the loop only when requests are
	// queued, the one case where it can let a request go. An idle
	// endpoint's stream thus hands off to the loop once (Acquire) instead
	// of three times. See post and settle.
	relMu    sync.Mutex
	rels     []release
	relWake  chan struct{} // capacity 1: "the mailbox has news"
	hasQueue atomic.Bool   // the loop holds queued requests; set by the loop
	stopped  atomic.Bool   // Run returned: releases are dropped

	// Everything below is owned by the Run goroutine.
	sched    *drr.Scheduler
	pol      *Policy
	eps      []*endpoint // by drr.EndpointID
	byAddr   map[string]drr.EndpointID
	byIP     map[string][]drr.EndpointID
	live     []drr.EndpointID
	freeIDs  []drr.EndpointID
	draining bool
	probe    drr.Probe
	timer    *time.Timer
	cands    []Candidate // scratch for picks
	order    []int       // scratch for picks
	relSpare []release   // the mailbox's other buffer

	// Endpoint intelligence (loop-owned unless noted).
	index      *picker.Index // nil: no prefix index
	indexGen   uint64        // bumped by every Record
	overlap    []int         // by EndpointID: blocks cached, valid for overlapFor at overlapGen
	overlapFor *waiter
	overlapGen uint64
	baseBS     int          // PrefixOptions.BlockSize
	hashBS     atomic.Int64 // read by request goroutines through BlockSize
	meanPrompt uint64       // moving mean of dispatched uncached tokens
}

type endpoint struct {
	id            drr.EndpointID
	addr          string
	maxBatched    uint64
	tainted       bool
	removed       bool
	activePrefill uint64
	inFlight      int

	engine policy.Engine
	// stale: metrics are expected and not fresh (busy, ranked last).
	stale bool
	// peakInFlight is the most requests this picker had in flight there
	// since the last metrics delivery: the most of the engine's queue that
	// can be ours.
	peakInFlight int
	// unseenWaiting and unseenPrefill: the engine's waiting requests that
	// are not ours, and the prompt tokens the busy test counts for them.
	unseenWaiting int
	unseenPrefill uint64
	// waiting is the engine's whole waiting queue at the last fresh scrape
	// (ours included), for the overload filter.
	waiting int
	// decoding is our requests past their first byte and not finished;
	// running the engine's running requests at the last scrape.
	decoding int
	running  int
	// engineBS is the engine's reported KV block size (0 unknown).
	engineBS int
}

// load is the prefill the busy test counts: ours plus the unseen estimate.
func (e *endpoint) load() uint64 { return drr.SaturatingAdd(e.activePrefill, e.unseenPrefill) }

type cmdKind uint8

const (
	cmdAcquire cmdKind = iota
	cmdCancel
	cmdEndpoints
	cmdPolicy
	cmdSnapshot
	cmdShutdown
	cmdMetrics
)

type command struct {
	kind  cmdKind
	w     *waiter
	eps   []Endpoint
	pol   *Policy
	mu    *metricsUpdate
	reply chan any
}

// release is one response-path event of a grant.
type release struct {
	g    *Grant
	done bool // Done; otherwise FirstByte
}

// metricsUpdate is one SetEndpointMetrics call.
type metricsUpdate struct {
	addr  string
	m     podmetrics.Metrics
	stale bool
}

// waiter is one Acquire call. The loop owns every field but reply, which
// it only sends on (buffered, once).
type waiter struct {
	t        *Ticket
	reply    chan result
	item     *drr.Item
	allow    []drr.EndpointID // nil: every live endpoint
	pinned   drr.EndpointID
	arrival  int64
	answered bool
	grant    *Grant
}

type result struct {
	g   *Grant
	err error
}

// New returns a dispatcher scheduling with pol.
func New(pol *Policy, opts Options) (*Dispatcher, error) {
	if err := pol.validate(); err != nil {
		return nil, err
	}
	s, err := drr.New(pol.Classes)
	if err != nil {
		return nil, fmt.Errorf("building scheduler: %w", err)
	}
	d := &Dispatcher{
		cmds:    make(chan command, 1024),
		done:    make(chan struct{}),
		relWake: make(chan struct{}, 1),
		start:   time.Now(),
		opts:    opts,
		obs:     opts.Observer,
		sched:   s,
		pol:     pol,
		byAddr:  map[string]drr.EndpointID{},
		byIP:    map[string][]drr.EndpointID{},
	}
	if d.obs == nil {
		d.obs = nopObserver{}
	}
	if d.opts.Picker == nil {
		d.opts.Picker = LeastLoaded{}
	}
	d.probe = prober{d}
	d.meanPrompt = unseenRequestSeed
	d.baseBS = DefaultBlockSize
	if p := opts.Prefix; p != nil {
		d.index = picker.NewIndex(p.Index)
		if p.BlockSize > 0 {
			d.baseBS = p.BlockSize
		}
	}
	d.hashBS.Store(int64(d.baseBS))
	return d, nil
}

// Run owns the state until ctx ends; then it answers every queued request
// with ErrShuttingDown and returns. Acquire calls after that fail fast.
func (d *Dispatcher) Run(ctx context.Context) {
	defer close(d.done)
	defer d.stopped.Store(true)
	d.timer = time.NewTimer(time.Hour)
	d.timer.Stop()
	for {
		d.settle()
		select {
		case c := <-d.cmds:
			d.takeReleases()
			d.handle(c)
		case <-d.relWake:
			if d.takeReleases() {
				d.drain()
			}
		case <-d.timer.C:
			d.takeReleases()
			d.drain()
		case <-ctx.Done():
			d.takeReleases()
			d.shutdown()
			// Answer what raced into the channel; later senders see done.
			for {
				select {
				case c := <-d.cmds:
					d.handle(c)
				default:
					return
				}
			}
		}
	}
}

// post puts a response-path event in the mailbox and wakes the loop if it
// holds queued requests, which the event may let go. It never blocks on
// the loop.
//
// No wake-up is lost: the loop publishes hasQueue before it looks at the
// mailbox a last time (settle), and post appends before it reads hasQueue,
// so either the loop's look finds the event or post sees hasQueue set.
func (d *Dispatcher) post(r release) {
	if d.stopped.Load() {
		return
	}
	d.relMu.Lock()
	d.rels = append(d.rels, r)
	d.relMu.Unlock()
	if d.hasQueue.Load() {
		select {
		case d.relWake <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
}

// takeReleases applies the mailbox's events in the order they were posted
// and reports whether there were any.
func (d *Dispatcher) takeReleases() bool {
	d.relMu.Lock()
	rs := d.rels
	d.rels = d.relSpare[:0]
	d.relMu.Unlock()
	for i, r := range rs {
		if r.done {
			d.finish(r.g)
		} else {
			d.prefillDone(r.g)
		}
		rs[i] = release{} // the grant may be collected
	}
	d.relSpare = rs
	return len(rs) > 0
}

// settle ends a loop turn: it publishes whether requests are queued and,
// if so, applies and drains for the events posted meanwhile, until none
// is left to look at.
func (d *Dispatcher) settle() {
	for {
		queued := d.sched.Len() > 0
		d.hasQueue.Store(queued)
		if !queued || !d.takeReleases() {
			return
		}
		d.drain()
	}
}

// send hands a command to the loop, or reports false once it has stopped.
func (d *Dispatcher) send(c command) bool {
	select {
	case d.cmds <- c:
		return true
	case <-d.done:
		return false
	}
}

// Acquire offers a ticket and waits until it is granted an endpoint or
// answered with an error: *drr.Rejection (429), *ShedError (429),
// *NoEndpointError (503), ErrShuttingDown (503), or ctx's error when the
// caller gave up (the ticket then leaves the queue at once).
func (d *Dispatcher) Acquire(ctx context.Context, t *Ticket) (*Grant, error) {
	w := waiters.Get().(*waiter)
	w.t, w.pinned = t, drr.NoEndpoint
	select {
	case d.cmds <- command{kind: cmdAcquire, w: w}:
	case <-d.done:
		putWaiter(w)
		return nil, ErrShuttingDown
	case <-ctx.Done():
		putWaiter(w)
		return nil, ctx.Err()
	}
	select {
	case r := <-w.reply:
		// Sending the answer was the loop's last use of w.
		putWaiter(w)
		return r.g, r.err
	case <-ctx.Done():
		// The loop may have answered in the meantime; the cancel command
		// then releases that grant instead of removing a queued item. The
		// loop keeps w, so it is not recycled.
		d.send(command{kind: cmdCancel, w: w})
		return nil, ctx.Err()
	case <-d.done:
		// Run answers everything before closing done.
		select {
		case r := <-w.reply:
			return r.g, r.err
		default:
			return nil, ErrShuttingDown
		}
	}
}

// waiters recycles waiters and their reply channels: two allocations per
// request otherwise. A waiter goes back only when the loop no longer
// holds it (never sent, or its answer received).
var waiters = sync.Pool{New: func() any { return &waiter{reply: make(chan result, 1)} }}

func putWaiter(w *waiter) {
	*w = waiter{reply: w.reply}
	waiters.Put(w)
}

// SetEndpoints replaces the endpoint set. Endpoints keep their accounting
// by address; requests pinned to a removed endpoint are answered 503 and
// shared requests are re-examined.
func (d *Dispatcher) SetEndpoints(eps []Endpoint) {
	cp := append([]Endpoint(nil), eps...)
	if d.send(command{kind: cmdEndpoints, eps: cp}) && d.opts.OnEndpoints != nil {
		d.opts.OnEndpoints(cp)
	}
}

// SetEndpointMetrics delivers a scrape of the endpoint at addr (it
// implements podmetrics.Sink): fresh metrics (stale false) update its
// unseen load, KV use and cache geometry; stale true makes it busy and
// ranked last until fresh metrics come. Unknown addresses are ignored.
func (d *Dispatcher) SetEndpointMetrics(addr string, m podmetrics.Metrics, stale bool) {
	d.send(command{kind: cmdMetrics, mu: &metricsUpdate{addr: addr, m: m, stale: stale}})
}

// BlockSize is the block size, in tokens, at which request parsers should
// hash prompts for the prefix index: PrefixOptions.BlockSize, or the
// largest KV block size an endpoint reports if that is larger. Safe for
// concurrent use.
func (d *Dispatcher) BlockSize() int { return int(d.hashBS.Load()) }

// SetPolicy swaps the class table without losing or reordering queued
// requests: each is resolved again with the new policy. An invalid policy
// is refused and the old one stays in force.
func (d *Dispatcher) SetPolicy(p *Policy) error {
	if err := p.validate(); err != nil {
		return err
	}
	r, ok := d.call(command{kind: cmdPolicy, pol: p})
	if !ok {
		return ErrShuttingDown
	}
	if err, _ := r.(error); err != nil {
		return err
	}
	return nil
}

// call sends a command that carries a reply channel and waits for the
// answer, or reports false when the loop stopped first.
func (d *Dispatcher) call(c command) (any, bool) {
	c.reply = make(chan any, 1)
	if !d.send(c) {
		return nil, false
	}
	select {
	case r := <-c.reply:
		return r, true
	case <-d.done:
		select {
		case r := <-c.reply:
			return r, true
		default:
			return nil, false
		}
	}
}

// Snapshot returns the queue and endpoint state (for metrics and status).
func (d *Dispatcher) Snapshot() (Snapshot, bool) {
	r, ok := d.call(command{kind: cmdSnapshot})
	if !ok {
		return Snapshot{}, false
	}
	return r.(Snapshot), true
}

// Shutdown stops admitting: queued requests and every later Acquire are
// answered with ErrShuttingDown. Dispatched requests keep their grants.
func (d *Dispatcher) Shutdown() {
	d.call(command{kind: cmdShutdown})
}

func (d *Dispatcher) now() int64 { return int64(time.Since(d.start)) }

func (d *Dispatcher) handle(c command) {
	switch c.kind {
	case cmdAcquire:
		d.admit(c.w)
	case cmdCancel:
		d.cancel(c.w)
	case cmdEndpoints:
		d.setEndpoints(c.eps)
		d.drain()
	case cmdPolicy:
		c.reply <- d.setPolicy(c.pol)
		d.drain()
	case cmdSnapshot:
		c.reply <- d.snapshot()
	case cmdShutdown:
		d.shutdown()
		c.reply <- nil
	case cmdMetrics:
		if d.setMetrics(c.mu) {
			d.drain()
		}
	}
}

func (d *Dispatcher) className(class int) string {
	if class >= 0 && class < len(d.pol.Classes) {
		return d.pol.Classes[class].Name
	}
	return ""
}

func (d *Dispatcher) answer(w *waiter, r result) {
	if w.answered {
		return
	}
	w.answered = true
	w.grant = r.g
	if d.overlapFor == w {
		d.overlapFor = nil // the waiter may be recycled for another request
	}
	w.reply <- r
}

func (d *Dispatcher) reject(w *waiter, err error, reason string) {
	d.obs.Rejected(d.className(w.t.Class), reason)
	d.answer(w, result{err: err})
}

func (d *Dispatcher) admit(w *waiter) {
	if d.draining {
		d.reject(w, ErrShuttingDown, "shutting_down")
		return
	}
	t := w.t
	t.Class = d.pol.Resolve(t)
	if t.Class < 0 || t.Class >= len(d.pol.Classes) {
		t.Class = 0
	}
	if err := d.resolveAllow(w); err != nil {
		d.reject(w, err, "no_endpoints")
		return
	}
	if d.snapshotCached(w) {
		// The cached tokens pick the cache bucket (SPEC §1, §2).
		t.Class = d.pol.Resolve(t)
		if t.Class < 0 || t.Class >= len(d.pol.Classes) {
			t.Class = 0
		}
	}
	v := d.judge(t.Class, w)
	if v == drr.Unroutable {
		d.reject(w, d.noEndpoint(w), "no_endpoints")
		return
	}
	w.arrival = d.now()
	item, err := d.sched.Offer(drr.Request{
		Class:          t.Class,
		Pinned:         w.pinned,
		RawISL:         t.RawISL,
		Cached:         t.Cached,
		Priority:       t.Priority,
		StrictPriority: t.Strict,
		Arrival:        w.arrival,
		Payload:        w,
	}, len(d.live), v == drr.Blocked)
	if err != nil {
		reason := "queue_limit"
		var rej *drr.Rejection
		if errors.As(err, &rej) {
			reason = "queue_limit_" + string(rej.Kind)
		}
		d.reject(w, err, reason)
		return
	}
	if item == nil {
		d.grant(w, false)
		return
	}
	w.item = item
	d.drain()
}

// resolveAllow turns the ticket's allow-list into endpoint IDs and decides
// whether the request is pinned.
func (d *Dispatcher) resolveAllow(w *waiter) error {
	t := w.t
	if !t.HasAllow {
		return nil
	}
	ids := make([]drr.EndpointID, 0, len(t.Allow))
	for _, a := range t.Allow {
		if id, ok := d.byAddr[a]; ok {
			ids = appendUnique(ids, id)
			continue
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			for _, id := range d.byIP[a] {
				ids = appendUnique(ids, id)
			}
		}
	}
	if len(ids) == 0 {
		return &NoEndpointError{Filter: "subset hint names no known endpoint"}
	}
	w.allow = ids
	if len(ids) == 1 {
		w.pinned = ids[0]
	}
	return nil
}

func appendUnique(ids []drr.EndpointID, id drr.EndpointID) []drr.EndpointID {
	for _, x := range ids {
		if x == id {
			return ids
		}
	}
	return append(ids, id)
}

func (d *Dispatcher) candidates(w *waiter) []drr.EndpointID {
	if w.allow != nil {
		return w.allow
	}
	return d.live
}

func (d *Dispatcher) eligible(e *endpoint, w *waiter) bool {
	if e == nil || e.removed || d.overloaded(e) {
		return false
	}
	return !e.tainted || w.pinned != drr.NoEndpoint
}

// overloaded is the overload filter: the engine's own queue is past
// MaxEngineQueue. Stale metrics do not trip it (staleness makes an
// endpoint busy instead), so an endpoint is never skipped on old numbers.
func (d *Dispatcher) overloaded(e *endpoint) bool {
	return d.opts.MaxEngineQueue > 0 && !e.stale && e.waiting > d.opts.MaxEngineQueue
}

// busy is the class's busy test (SPEC §5) on the endpoint's prefill load,
// ours plus the unseen estimate; an endpoint with stale metrics is busy.
func (d *Dispatcher) busy(e *endpoint, class int) bool {
	return e.stale || d.pol.Busy[class].EndpointBusy(e.load(), e.maxBatched)
}

// judge is the busy test of SPEC §5 over a request's eligible endpoints.
func (d *Dispatcher) judge(class int, w *waiter) drr.Verdict {
	eligible, busy := 0, 0
	for _, id := range d.candidates(w) {
		e := d.endpointByID(id)
		if !d.eligible(e, w) {
			continue
		}
		eligible++
		if d.busy(e, class) {
			busy++
		}
	}
	if eligible == 0 {
		return drr.Unroutable
	}
	if d.pol.Busy[class].SharedBlocked(busy, eligible) {
		return drr.Blocked
	}
	return drr.Ready
}

func (d *Dispatcher) noEndpoint(w *waiter) error {
	overloaded := false
	for _, id := range d.candidates(w) {
		if e := d.endpointByID(id); e != nil && !e.removed && d.overloaded(e) {
			overloaded = true
			break
		}
	}
	switch {
	case overloaded:
		return &NoEndpointError{Filter: fmt.Sprintf("overload filter: the engine queue of every candidate endpoint is past --max-engine-queue=%d", d.opts.MaxEngineQueue)}
	case len(d.live) == 0:
		return &NoEndpointError{Filter: "the pool has no ready endpoint"}
	case w.allow != nil:
		return &NoEndpointError{Filter: "no endpoint of the subset hint is available"}
	default:
		return &NoEndpointError{Filter: "every endpoint is tainted"}
	}
}

func (d *Dispatcher) endpointByID(id drr.EndpointID) *endpoint {
	if int(id) < len(d.eps) {
		return d.eps[id]
	}
	return nil
}

type prober struct{ d *Dispatcher }

func (p prober) Shared(class int, it *drr.Item) drr.Verdict {
	return p.d.judge(class, it.Payload.(*waiter))
}

func (p prober) Lane(class int, ep drr.EndpointID) drr.Verdict {
	e := p.d.endpointByID(ep)
	if e == nil || e.removed || p.d.overloaded(e) {
		return drr.Unroutable
	}
	if p.d.busy(e, class) {
		return drr.Blocked
	}
	return drr.Ready
}

// drain pops until nothing more can leave the queue, then arms the timer
// for the next wait-budget expiry.
func (d *Dispatcher) drain() {
	for d.sched.Len() > 0 {
		it, out := d.sched.Pop(d.now(), d.probe)
		if out == drr.None {
			break
		}
		w := it.Payload.(*waiter)
		w.item = nil
		switch out {
		case drr.Dispatch:
			d.grant(w, true)
		case drr.Expired:
			cfg := d.pol.Classes[it.Class]
			d.reject(w, &ShedError{
				Class:  cfg.Name,
				Waited: time.Duration(d.now() - w.arrival),
				Budget: cfg.WaitBudget,
			}, "shed")
		case drr.NoRoute:
			d.reject(w, d.noEndpoint(w), "no_endpoints")
		}
	}
	d.armTimer()
}

func (d *Dispatcher) armTimer() {
	if d.timer == nil {
		return
	}
	d.timer.Stop()
	if at, ok := d.sched.NextExpiry(); ok {
		delay := time.Duration(at - d.now())
		if delay < 0 {
			delay = 0
		}
		d.timer.Reset(delay)
	}
}

// grant picks the endpoint(s), charges the pick and answers the waiter.
func (d *Dispatcher) grant(w *waiter, queued bool) {
	t := w.t
	d.cands = d.cands[:0]
	reuse := d.overlapFor == w && d.overlapGen == d.indexGen
	hashes := d.cacheableBlocks(t)
	now := d.now()
	for _, id := range d.candidates(w) {
		e := d.endpointByID(id)
		if !d.eligible(e, w) {
			continue
		}
		var cached uint64
		if len(hashes) > 0 {
			n := 0
			if reuse {
				n = d.overlap[id]
			} else {
				n = d.index.Overlap(int(id), hashes, now)
			}
			cached = min(uint64(n)*uint64(t.BlockSize), t.RawISL)
		}
		d.cands = append(d.cands, Candidate{
			ID:            e.id,
			Addr:          e.addr,
			ActivePrefill: e.activePrefill,
			InFlight:      e.inFlight,
			Busy:          d.busy(e, t.Class),
			Stale:         e.stale,
			CachedTokens:  cached,
			UnseenPrefill: e.unseenPrefill,
			Decoding:      max(e.decoding, e.running),
		})
	}
	d.overlapFor = nil
	if len(d.cands) == 0 {
		d.reject(w, d.noEndpoint(w), "no_endpoints")
		return
	}
	d.order = d.opts.Picker.Pick(t, d.cands, d.order[:0])
	n := 1 + d.opts.MaxFallbacks
	if n > len(d.order) {
		n = len(d.order)
	}
	e := d.eps[d.cands[d.order[0]].ID]
	g := &Grant{d: d, ep: e, Engine: e.engine, prefill: t.Uncached()}
	if n == 1 {
		g.pick[0] = e.addr
		g.Endpoints = g.pick[:1:1] // no fallbacks (the default): no second allocation
	} else {
		g.Endpoints = make([]string, n)
		for i := 0; i < n; i++ {
			g.Endpoints[i] = d.cands[d.order[i]].Addr
		}
	}
	e.activePrefill = drr.SaturatingAdd(e.activePrefill, g.prefill)
	e.inFlight++
	e.peakInFlight = max(e.peakInFlight, e.inFlight)
	d.sched.EndpointChanged(e.id)
	if d.index != nil && len(t.Blocks) > 0 && t.BlockSize > 0 {
		d.index.Record(int(e.id), t.Blocks, t.BlockSize, now)
		d.indexGen++
	}
	// The unseen-load estimate: a moving mean (1/16) of what we dispatch.
	d.meanPrompt = d.meanPrompt - d.meanPrompt/16 + g.prefill/16
	var wait time.Duration
	if queued {
		wait = time.Duration(d.now() - w.arrival)
	}
	d.obs.Dispatched(d.className(t.Class), queued, wait)
	d.answer(w, result{g: g})
}

func (d *Dispatcher) cancel(w *waiter) {
	if w.item != nil {
		if d.sched.Remove(w.item) {
			w.item = nil
			d.obs.Rejected(d.className(w.t.Class), "cancelled")
			w.answered = true
			return
		}
	}
	if !w.answered {
		// Not admitted yet is impossible (Acquire sent it first); treat
		// as answered so nothing is sent later.
		w.answered = true
		return
	}
	if g := w.grant; g != nil && g.done.CompareAndSwap(false, true) {
		// The grant was sent but never received: release it.
		d.finish(g)
		d.drain()
	}
}

func (d *Dispatcher) prefillDone(g *Grant) {
	if g.prefillReleased {
		return
	}
	g.prefillReleased = true
	e := g.ep
	if e.activePrefill >= g.prefill {
		e.activePrefill -= g.prefill
	} else {
		e.activePrefill = 0
	}
	// Past prefill the request decodes.
	e.decoding++
	if !e.removed {
		d.sched.EndpointChanged(e.id)
	}
}

func (d *Dispatcher) finish(g *Grant) {
	d.prefillDone(g)
	e := g.ep
	if e.inFlight > 0 {
		e.inFlight--
	}
	if e.decoding > 0 {
		e.decoding--
	}
}

func (d *Dispatcher) setEndpoints(eps []Endpoint) {
	d.overlapFor = nil // per-endpoint overlaps may name other endpoints now
	seen := make(map[string]bool, len(eps))
	for _, in := range eps {
		if in.Addr == "" || seen[in.Addr] {
			continue
		}
		seen[in.Addr] = true
		eng := EngineOf(in.Engine, d.opts.DefaultEngine)
		if id, ok := d.byAddr[in.Addr]; ok {
			e := d.eps[id]
			e.engine = eng
			if e.maxBatched != in.MaxBatchedTokens || e.tainted != in.Tainted {
				e.maxBatched, e.tainted = in.MaxBatchedTokens, in.Tainted
				d.sched.EndpointChanged(id)
			}
			continue
		}
		var id drr.EndpointID
		if n := len(d.freeIDs); n > 0 {
			id = d.freeIDs[n-1]
			d.freeIDs = d.freeIDs[:n-1]
		} else {
			id = drr.EndpointID(len(d.eps))
			d.eps = append(d.eps, nil)
		}
		d.eps[id] = &endpoint{id: id, addr: in.Addr, maxBatched: in.MaxBatchedTokens, tainted: in.Tainted,
			engine: eng, stale: d.opts.ExpectMetrics}
		if d.index != nil {
			d.index.Drop(int(id)) // a reused ID starts with an empty index
		}
		d.byAddr[in.Addr] = id
		d.sched.EndpointChanged(id)
	}
	var removed []drr.EndpointID
	for addr, id := range d.byAddr {
		if !seen[addr] {
			d.eps[id].removed = true
			delete(d.byAddr, addr)
			d.sched.EndpointChanged(id)
			removed = append(removed, id)
			if d.index != nil {
				d.index.Drop(int(id))
			}
		}
	}
	d.rebuildIndex()
	if len(removed) > 0 {
		d.updateHashBlockSize()
	}
	if len(removed) > 0 {
		// Lanes of removed endpoints empty out (503) in this drain; only
		// then may their IDs be reused.
		d.drain()
		for _, id := range removed {
			d.eps[id] = nil
		}
		d.freeIDs = append(d.freeIDs, removed...)
	}
}

func (d *Dispatcher) rebuildIndex() {
	d.live = d.live[:0]
	clear(d.byIP)
	for _, e := range d.eps {
		if e == nil || e.removed {
			continue
		}
		d.live = append(d.live, e.id)
		if host, _, err := net.SplitHostPort(e.addr); err == nil {
			d.byIP[host] = append(d.byIP[host], e.id)
		}
	}
	sort.Slice(d.live, func(i, j int) bool { return d.eps[d.live[i]].addr < d.eps[d.live[j]].addr })
}

func (d *Dispatcher) setPolicy(p *Policy) error {
	err := d.sched.SetClasses(p.Classes, func(it *drr.Item) int {
		w := it.Payload.(*waiter)
		c := p.Resolve(w.t)
		if c < 0 || c >= len(p.Classes) {
			c = 0
		}
		w.t.Class = c
		return c
	})
	if err != nil {
		return fmt.Errorf("applying policy: %w", err)
	}
	d.pol = p
	// Busy rules changed: every lane verdict is stale.
	for _, id := range d.live {
		d.sched.EndpointChanged(id)
	}
	return nil
}

func (d *Dispatcher) snapshot() Snapshot {
	s := Snapshot{Classes: d.sched.Stats(), Queued: d.sched.Len()}
	for _, id := range d.live {
		e := d.eps[id]
		es := EndpointSnapshot{
			Addr: e.addr, ActivePrefill: e.activePrefill, InFlight: e.inFlight, Tainted: e.tainted,
			Stale: e.stale, UnseenWaiting: e.unseenWaiting, UnseenPrefill: e.unseenPrefill,
		}
		if d.index != nil {
			es.IndexTokens = d.index.Stats(int(id)).Tokens
		}
		s.Endpoints = append(s.Endpoints, es)
	}
	return s
}

// shutdown answers every queued request with ErrShuttingDown and refuses
// new ones.
func (d *Dispatcher) shutdown() {
	d.draining = true
	for _, e := range d.eps {
		if e != nil {
			d.sched.EndpointChanged(e.id)
		}
	}
	for d.sched.Len() > 0 {
		it, out := d.sched.Pop(d.now(), refuseAll{})
		if out == drr.None {
			break // cannot happen: refuseAll makes every head leave
		}
		w := it.Payload.(*waiter)
		w.item = nil
		d.reject(w, ErrShuttingDown, "shutting_down")
	}
	if d.timer != nil {
		d.timer.Stop()
	}
}

// refuseAll is the probe used at shutdown: every head leaves as
// Unroutable, so the whole queue empties without charging anything.
type refuseAll struct{}

func (refuseAll) Shared(int, *drr.Item) drr.Verdict    { return drr.Unroutable }
func (refuseAll) Lane(int, drr.EndpointID) drr.Verdict { return drr.Unroutable }

// Grant is an endpoint given to a request. Its response-path events release
// the endpoint's accounting; it implements extproc's Lifecycle.
type Grant struct {
	d  *Dispatcher
	ep *endpoint
	// Endpoints is the pick followed by ordered fallbacks ("ip:port").
	Endpoints []string
	// Engine is the picked endpoint's engine (for the priority polarity).
	Engine policy.Engine

	pick            [1]string // Endpoints' storage when there are no fallbacks
	prefill         uint64    // loop-owned
	prefillReleased bool      // loop-owned
	firstByte       atomic.Bool
	done            atomic.Bool
}

// FirstByte reports the first response byte: the endpoint finished this
// request's prefill.
func (g *Grant) FirstByte() {
	if g.firstByte.CompareAndSwap(false, true) && !g.done.Load() {
		g.d.post(release{g: g})
	}
}

// Done reports the end of the request's stream; it is safe to call more
// than once.
func (g *Grant) Done() {
	if g.done.CompareAndSwap(false, true) {
		g.d.post(release{g: g, done: true})
	}
}
