package simulate

import (
	"fmt"
	"math"
	"time"

	"github.com/laneway-dev/laneway/pkg/affinity"
	"github.com/laneway-dev/laneway/pkg/engine"
	"github.com/laneway-dev/laneway/pkg/podmetrics"
	"github.com/laneway-dev/laneway/pkg/policy"
	"github.com/laneway-dev/laneway/pkg/sched"
)

// Options are the settings of a run besides the trace, fleet and policy.
type Options struct {
	// Seed drives the cost picker's tie-breaks.
	Seed uint64
	// ScrapeInterval, when > 0, feeds each server's engine metrics to the
	// core every interval (staggered across servers), as the picker's
	// scraper does, and makes the core expect them. 0: no scraping, except
	// for a policy with an auto threshold, which reads the engine's
	// counters as the picker does: it is scraped at the picker's default
	// interval (podmetrics.DefaultScrapeInterval).
	ScrapeInterval time.Duration
	// Retries is how many times a request answered 429 is offered again,
	// RetryDelay after each answer. 0: a 429 is final.
	Retries    int
	RetryDelay time.Duration
	// PrefixCacheTTL ages the picker's prefix index (0: by capacity only).
	PrefixCacheTTL time.Duration
	// Progress, when set, is called now and then with the requests that
	// have ended (answered or finished) and the total.
	Progress func(done, total int)
	// DisaggregateAboveUncachedTokens is the pool's disaggregation
	// threshold (the picker's --disaggregate-above-uncached-tokens), for a
	// fleet with prefill servers.
	DisaggregateAboveUncachedTokens uint64
	// NoLoRAAffinity turns off the picker's LoRA tier (--lora-affinity
	// false): the baseline adapter placement.
	NoLoRAAffinity bool
	// Restarts restart servers during the run.
	Restarts []Restart
}

// Restart is a server restarting, possibly with another engine: the
// requests it holds fail (503), its counters start from zero, and the
// picker is told the new engine's max_num_batched_tokens (as a new pod's
// configuration tells it).
type Restart struct {
	// After is the time since the trace's first arrival.
	After time.Duration
	// Server is the index of the server in the fleet.
	Server int
	// Engine is the engine it runs from then on.
	Engine engine.Config
}

// DefaultPrefixCacheTTL is the picker's --prefix-cache-ttl default.
const DefaultPrefixCacheTTL = 10 * time.Minute

// Outcome is what happened to one request in one run. Times are
// nanoseconds of virtual time; -1 means never.
type Outcome struct {
	// Leave is when the request left the picker: granted (dispatched) or
	// answered with an error.
	Leave int64
	// Start is when its engine admitted it to a running slot; First and
	// End are the first and last token.
	Start, First, End int64
	// Server is the index of the server that served it (decoded it, for
	// a disaggregated request), -1 for none; Prefill the server that
	// prefilled a disaggregated request, -1 otherwise.
	Server  int32
	Prefill int32
	// Cached is the cost snapshot's cached tokens (SPEC §1), EngineCached
	// what the server's prefix cache actually held.
	Cached, EngineCached uint32
	// Status is 200, 429 or 503; 0 only while running.
	Status int16
	// Class is the index of the class it left in (Result.Classes).
	Class uint16
	// Queued says it waited in the picker's queue.
	Queued bool
	// Attempts counts offers to the picker (more than 1 with retries).
	Attempts uint8
}

// Result is one policy's run over a trace.
type Result struct {
	Policy *Policy
	// Trace is the trace the run replayed.
	Trace *Trace
	// Classes are the class names (the policy's DRR names).
	Classes []string
	// Outcomes are by request, in trace order.
	Outcomes []Outcome
	// Decisions is every decision the core returned (Leaves), CoreTime
	// the wall time spent in core calls, Wall the whole run's wall time.
	Decisions int64
	CoreTime  time.Duration
	Wall      time.Duration
	// Instants counts the distinct virtual times the run processed.
	Instants int64
	// LoRALoads counts the adapter loads of every server's engine.
	LoRALoads uint64
	// Thresholds is, per server, its auto threshold after each scrape
	// (empty for a policy without auto classes).
	Thresholds [][]ThresholdPoint
}

// ThresholdPoint is one server's auto threshold at one scrape, with what
// the engine showed.
type ThresholdPoint struct {
	At        int64
	Threshold uint64
	Waiting   int
}

// Simulated requests whose ticket is in the core or whose grant is held by
// an engine. Slots are recycled once the request has ended, so a run holds
// only what is in flight.
type slot struct {
	req     sched.Request
	ticket  sched.Ticket
	idx     int32
	grant   *sched.Grant
	blocks  []uint64 // the ticket's hashes
	eblocks []uint64 // the engine's, when its block size differs
	// A disaggregated request is prefilled on one server (stage
	// stagePrefill), waits for its KV cache (stageTransfer), then decodes
	// on dec (stageDecode); any other request is stageWhole.
	stage uint8
	dec   int32
	// decEpoch is the decode server's epoch when the grant named it: a
	// restart of that server since fails the request (its sidecar held
	// it) when the prefill ends or the KV cache arrives.
	decEpoch uint32
}

// Stages of a slot's request.
const (
	stageWhole uint8 = iota
	stagePrefill
	stageTransfer
	stageDecode
)

// server is one simulated server's state in a run.
type server struct {
	Server
	idx     int32
	eng     *engine.Engine
	gen     uint32 // generation of the pending wake event
	pending bool   // a wake event with gen is in the heap
	wake    int64
	touched bool
	// epoch counts the server's restarts.
	epoch uint32
	// loraLoads are the adapter loads of the engines restarts replaced.
	loraLoads uint64
}

// run is one policy's simulation.
type run struct {
	trace   *Trace
	pol     *Policy
	opts    Options
	core    *sched.Core
	servers []*server
	byAddr  map[string]int32
	classes map[string]uint16
	res     *Result
	h       eventHeap
	free    []*slot
	// transfers are the disaggregated requests whose KV cache is on its
	// way to their decode server, by request.
	transfers map[int32]*slot
	evs       []engine.Event
	touched   []*server
	done      int
	// deadline is the pending NextDeadline event's time (-1 none).
	deadline int64
}

// Run simulates one policy over a trace on a fleet. It is deterministic:
// the same inputs and Options.Seed give the same Result.
func Run(t *Trace, f *Fleet, p *Policy, opts Options) (*Result, error) {
	start := time.Now()
	if err := checkFits(t, f); err != nil {
		return nil, err
	}
	pol := sched.FromCompiled(p.Compiled)
	if opts.ScrapeInterval == 0 && p.Auto() {
		opts.ScrapeInterval = podmetrics.DefaultScrapeInterval
	}
	bs, capacity := 0, uint64(math.MaxUint64)
	for _, s := range f.Servers {
		bs = max(bs, s.Engine.BlockSize)
		capacity = min(capacity, uint64(s.Engine.BlockSize)*uint64(s.Engine.NumGPUBlocks))
	}
	ttl := opts.PrefixCacheTTL
	core, err := sched.New(pol, sched.Options{
		Chooser:       p.newPicker(opts.Seed),
		ExpectMetrics: opts.ScrapeInterval > 0,
		DefaultEngine: policy.EngineVLLM, // modelsim speaks vLLM
		Prefix: &sched.PrefixOptions{BlockSize: bs, Index: affinity.IndexOptions{
			TTL: ttl, DefaultCapacity: capacity,
		}},
		DisaggregateAboveUncachedTokens: opts.DisaggregateAboveUncachedTokens,
		DisableLoRAAffinity:             opts.NoLoRAAffinity,
	})
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", p.Name, err)
	}
	r := &run{trace: t, pol: p, opts: opts, core: core, byAddr: map[string]int32{}, classes: map[string]uint16{}, deadline: -1, h: newEventHeap(),
		transfers: map[int32]*slot{}}
	r.res = &Result{Policy: p, Trace: t, Outcomes: make([]Outcome, len(t.Requests))}
	for i := range p.Compiled.Classes {
		name := core.ClassName(i)
		r.classes[name] = uint16(i)
		r.res.Classes = append(r.res.Classes, name)
	}
	for i := range r.res.Outcomes {
		r.res.Outcomes[i] = Outcome{Leave: -1, Start: -1, First: -1, End: -1, Server: -1, Prefill: -1}
	}
	var eps []sched.Endpoint
	for i, s := range f.Servers {
		cfg := s.Engine
		cfg.Coalesce = true
		cfg.MaxLag = 0
		eng, err := engine.New(cfg)
		if err != nil {
			return nil, fmt.Errorf("server %d: %w", i, err)
		}
		r.servers = append(r.servers, &server{Server: s, idx: int32(i), eng: eng})
		r.byAddr[s.Addr] = int32(i)
		eps = append(eps, sched.Endpoint{Addr: s.Addr, MaxBatchedTokens: uint64(s.Engine.MaxNumBatchedTokens), Role: s.Role})
	}
	t0 := t.Requests[t.byArrival[0]].Arrival
	core.SetEndpoints(t0, eps)
	r.handleLeaves(t0, core.Drain(t0))
	if opts.ScrapeInterval > 0 {
		// The picker is ready once every endpoint has been scraped; then
		// each is scraped every interval, staggered.
		n := int64(len(r.servers))
		for i, s := range r.servers {
			r.scrape(t0, s)
			r.h.push(event{at: t0 + int64(opts.ScrapeInterval)*(1+int64(i))/n, kind: evScrape, idx: int32(i)})
		}
	}
	for i, rs := range opts.Restarts {
		if rs.Server < 0 || rs.Server >= len(r.servers) {
			return nil, fmt.Errorf("restart %d: no server %d", i, rs.Server)
		}
		if err := rs.Engine.Validate(); err != nil {
			return nil, fmt.Errorf("restart %d: %w", i, err)
		}
		r.h.push(event{at: t0 + int64(rs.After), kind: evRestart, idx: int32(i)})
	}
	r.loop()
	for _, s := range r.servers {
		r.res.LoRALoads += s.loraLoads + s.eng.Stats().LoRALoads
	}
	r.res.Wall = time.Since(start)
	return r.res, nil
}

// checkFits refuses a trace with a request no server's KV cache can hold:
// it would wait in its engine forever.
func checkFits(t *Trace, f *Fleet) error {
	smallest := f.Servers[0].Engine
	for _, s := range f.Servers {
		if s.Engine.BlockSize*s.Engine.NumGPUBlocks < smallest.BlockSize*smallest.NumGPUBlocks {
			smallest = s.Engine
		}
	}
	for i := range t.Requests {
		q := &t.Requests[i]
		if need := smallest.Blocks(q.PromptTokens, q.OutputTokens); need > smallest.NumGPUBlocks {
			return fmt.Errorf("trace %s: request %d (%d prompt + %d output tokens) needs %d KV blocks; a server has only %d (raise --num-gpu-blocks)",
				t.Source, i, q.PromptTokens, q.OutputTokens, need, smallest.NumGPUBlocks)
		}
	}
	return nil
}

// loop processes instants in virtual-time order until nothing is left: at
// each instant the engines' step ends (and their releases), the scrapes,
// the retries and the arrivals, then one Drain, then the engines' next
// steps.
func (r *run) loop() {
	arr := r.trace.byArrival
	reqs := r.trace.Requests
	next := 0
	total := len(reqs)
	lastProgress := time.Now()
	for iter := 0; ; iter++ {
		t := int64(math.MaxInt64)
		if next < len(arr) {
			t = reqs[arr[next]].Arrival
		}
		if r.h.len() > 0 && r.h.top().at < t {
			t = r.h.top().at
		}
		if t == math.MaxInt64 {
			break
		}
		r.res.Instants++
		for r.h.len() > 0 && r.h.top().at == t {
			ev := r.h.pop()
			switch ev.kind {
			case evWake:
				s := r.servers[ev.idx]
				if ev.gen != s.gen || !s.pending {
					continue // superseded by a later Schedule
				}
				s.pending = false
				r.evs = s.eng.Advance(t, r.evs[:0])
				r.engineEvents(t)
				r.touch(s)
			case evScrape:
				s := r.servers[ev.idx]
				r.scrape(t, s)
				if r.done < total {
					r.h.push(event{at: t + int64(r.opts.ScrapeInterval), kind: evScrape, idx: ev.idx})
				}
			case evRetry:
				r.admit(t, ev.idx)
			case evDeadline:
				r.deadline = -1 // the Drain below sheds what expired
			case evTransfer:
				r.decode(t, ev.idx)
			case evRestart:
				r.restart(t, r.opts.Restarts[ev.idx])
			}
		}
		for next < len(arr) && reqs[arr[next]].Arrival == t {
			r.admit(t, arr[next])
			next++
		}
		c0 := time.Now()
		leaves := r.core.Drain(t)
		r.res.CoreTime += time.Since(c0)
		r.handleLeaves(t, leaves)
		for _, s := range r.touched {
			s.touched = false
			var wake int64
			var busy bool
			r.evs, wake, busy = s.eng.Schedule(t, r.evs[:0])
			r.engineEvents(t)
			if busy && (!s.pending || wake != s.wake) {
				s.gen++
				s.pending, s.wake = true, wake
				r.h.push(event{at: wake, kind: evWake, idx: s.idx, gen: s.gen})
			}
		}
		r.touched = r.touched[:0]
		if at, ok := r.core.NextDeadline(); ok && at != r.deadline {
			r.deadline = at
			r.h.push(event{at: max(at, t), kind: evDeadline})
		}
		if r.opts.Progress != nil && iter&4095 == 0 && time.Since(lastProgress) > 100*time.Millisecond {
			lastProgress = time.Now()
			r.opts.Progress(r.done, total)
		}
		if r.done == total {
			break // what is left in the heap (scrapes, stale wakes) changes nothing
		}
	}
	if r.opts.Progress != nil {
		r.opts.Progress(r.done, total)
	}
}

func (r *run) touch(s *server) {
	if !s.touched {
		s.touched = true
		r.touched = append(r.touched, s)
	}
}

// admit offers trace request i to the core at t.
func (r *run) admit(t int64, i int32) {
	q := &r.trace.Requests[i]
	var sl *slot
	if n := len(r.free); n > 0 {
		sl = r.free[n-1]
		r.free = r.free[:n-1]
	} else {
		sl = &slot{}
	}
	sl.idx = i
	sl.grant = nil
	sl.stage = stageWhole
	sl.ticket = sched.Ticket{
		Model:        q.Adapter,
		ClassHeader:  q.Class,
		RawISL:       uint64(q.PromptTokens),
		Priority:     q.Priority,
		HasPriority:  q.HasPriority,
		Strict:       q.Strict,
		OutputTokens: uint64(q.OutputTokens),
	}
	if r.trace.cacheable {
		bs := r.core.BlockSize()
		sl.blocks = q.appendHashes(sl.blocks[:0], bs, uint64(i))
		sl.ticket.Blocks, sl.ticket.BlockSize = sl.blocks, bs
	}
	// The trace's tenant is what the x-laneway-tenant header (or the
	// identity source) would carry: the policy grants it (SPEC §14).
	sl.ticket.Tenant = q.Tenant
	sl.req.Reset(&sl.ticket, sl)
	r.res.Outcomes[i].Attempts++
	c0 := time.Now()
	r.core.Admit(t, &sl.req)
	r.res.CoreTime += time.Since(c0)
}

// handleLeaves applies the core's decisions: grants go to their server's
// engine, errors end the request (or schedule its retry).
func (r *run) handleLeaves(t int64, leaves []sched.Leave) {
	r.res.Decisions += int64(len(leaves))
	for i := range leaves {
		l := &leaves[i]
		sl := l.Req.Owner.(*slot)
		o := &r.res.Outcomes[sl.idx]
		o.Leave = t
		o.Class = r.classes[l.Class]
		o.Queued = l.Queued
		if l.Grant == nil {
			status := int16(sched.StatusOf(l.Err))
			if status == 429 && int(o.Attempts) <= r.opts.Retries {
				r.h.push(event{at: t + int64(r.opts.RetryDelay), kind: evRetry, idx: sl.idx})
			} else {
				o.Status = status
				r.done++
			}
			r.free = append(r.free, sl)
			continue
		}
		sl.grant = l.Grant
		si := r.byAddr[l.Grant.Endpoints[0]]
		o.Server = si
		o.Cached = uint32(min(sl.ticket.Cached, math.MaxUint32))
		q := &r.trace.Requests[sl.idx]
		if p := l.Grant.Prefiller(); p != "" {
			// Disaggregated: the decode server's sidecar prefills on the
			// prefill server with max_tokens 1 first (decode, below).
			pi := r.byAddr[p]
			o.Prefill = pi
			sl.stage, sl.dec, sl.decEpoch = stagePrefill, si, r.servers[si].epoch
			r.submit(t, sl, r.servers[pi], q, l.Grant, engine.Request{MaxTokens: 1})
			continue
		}
		r.submit(t, sl, r.servers[si], q, l.Grant, engine.Request{MaxTokens: q.OutputTokens})
	}
}

// submit hands request q (its slot sl) to server s's engine at t, with
// the prompt, its hashes for that engine and its forwarded priority
// filled into req.
func (r *run) submit(t int64, sl *slot, s *server, q *Request, g *sched.Grant, req engine.Request) {
	if r.trace.cacheable && s.Engine.EnablePrefixCaching {
		if s.Engine.BlockSize == sl.ticket.BlockSize {
			req.Hashes = sl.blocks
		} else {
			sl.eblocks = q.appendHashes(sl.eblocks[:0], s.Engine.BlockSize, uint64(sl.idx))
			req.Hashes = sl.eblocks
		}
	}
	if s.Engine.SchedulingPolicy == engine.PolicyPriority && q.HasPriority {
		if v, ok := policy.ForwardPriority(g.Engine, q.Priority); ok {
			req.Priority = int(v)
		}
	}
	req.PromptTokens, req.LoRA, req.Data = q.PromptTokens, q.Adapter, sl
	if _, err := s.eng.Submit(t, req); err != nil {
		panic(fmt.Sprintf("simulate: request %d: %v (checkFits lets no such request through)", sl.idx, err))
	}
	r.touch(s)
}

// decode is a disaggregated request's KV cache reaching its decode server
// at t: the server decodes it with the whole prompt counted as cached.
func (r *run) decode(t int64, i int32) {
	sl := r.transfers[i]
	delete(r.transfers, i)
	s := r.servers[sl.dec]
	if s.epoch != sl.decEpoch {
		r.fail(sl) // the decode server restarted while the KV cache travelled
		return
	}
	// The server's step may end at t too: complete it before the Submit,
	// as at every instant.
	r.evs = s.eng.Advance(t, r.evs[:0])
	r.engineEvents(t)
	sl.stage = stageDecode
	q := &r.trace.Requests[i]
	r.submit(t, sl, s, q, sl.grant, engine.Request{MaxTokens: q.OutputTokens, TransferredTokens: q.PromptTokens})
}

// engineEvents applies the events in r.evs: first tokens and ends release
// the grant's accounting in the core.
func (r *run) engineEvents(t int64) {
	for _, ev := range r.evs {
		sl := ev.Seq.Data.(*slot)
		o := &r.res.Outcomes[sl.idx]
		if sl.stage == stagePrefill {
			r.prefillEvent(ev, sl, o)
			continue
		}
		if sl.stage == stageDecode && ev.Kind == engine.Started {
			continue // the prefill server's start and cache hit stand
		}
		c0 := time.Now()
		switch ev.Kind {
		case engine.Started:
			o.Start = t
			o.EngineCached = uint32(ev.Seq.CachedTokens)
			continue
		case engine.FirstToken:
			o.First = t
			r.core.Release(sl.grant, sched.EventFirstByte)
		case engine.Done:
			o.End = t
			o.Status = 200
			r.core.Release(sl.grant, sched.EventDone)
			sl.grant = nil
			r.free = append(r.free, sl)
			r.done++
		}
		r.res.CoreTime += time.Since(c0)
	}
}

// prefillEvent is an engine event of a disaggregated request on its
// prefill server: its start and cache hit are the request's; its end
// sends the KV cache on its way to the decode server, which has it after
// that server's KV transfer time.
func (r *run) prefillEvent(ev engine.Event, sl *slot, o *Outcome) {
	switch ev.Kind {
	case engine.Started:
		o.Start = ev.At
		o.EngineCached = uint32(ev.Seq.CachedTokens)
	case engine.Done:
		if r.servers[sl.dec].epoch != sl.decEpoch {
			r.fail(sl) // the decode server restarted during the prefill
			return
		}
		sl.stage = stageTransfer
		r.transfers[sl.idx] = sl
		r.h.push(event{at: ev.At + int64(r.servers[sl.dec].KVTransferTime), kind: evTransfer, idx: sl.idx})
	}
}

// scrape hands the core one server's engine metrics, as a scrape would
// read them from modelsim's /metrics page.
func (r *run) scrape(now int64, s *server) {
	st := s.eng.Stats()
	m := podmetrics.Metrics{
		Known: podmetrics.Waiting | podmetrics.Running | podmetrics.KVCacheUsage | podmetrics.BlockSize | podmetrics.NumBlocks |
			podmetrics.PromptTokens | podmetrics.GenerationTokens | podmetrics.Finished,
		Waiting: st.Waiting, Running: st.Running, KVCacheUsage: st.KVUsage(),
		BlockSize: s.Engine.BlockSize, NumBlocks: s.Engine.NumGPUBlocks, PromptTokens: float64(st.PromptTokens),
		GenerationTokens: float64(st.GeneratedTokens), Finished: float64(st.Finished),
	}
	if s.Engine.MaxLoRAs > 0 {
		// modelsim exposes vllm:lora_requests_info only with --max-loras.
		m.Known |= podmetrics.LoRA
		m.LoRA.Running, m.LoRA.Waiting = s.eng.AdapterNames()
		m.LoRA.MaxLoRA = s.Engine.MaxLoRAs
	}
	c0 := time.Now()
	r.core.SetMetrics(now, s.Addr, m, false)
	r.res.CoreTime += time.Since(c0)
	if t, ok := r.core.AutoThreshold(s.Addr); ok {
		if r.res.Thresholds == nil {
			r.res.Thresholds = make([][]ThresholdPoint, len(r.servers))
		}
		r.res.Thresholds[s.idx] = append(r.res.Thresholds[s.idx], ThresholdPoint{At: now, Threshold: t, Waiting: st.Waiting})
	}
}

// restart replaces a server's engine at t (Options.Restarts): what the old
// one held fails with 503, and the picker gets the new step budget. The
// disaggregated requests it was the decode server of, still prefilling
// elsewhere or in transfer, fail when they would reach it (decEpoch).
func (r *run) restart(t int64, rs Restart) {
	s := r.servers[rs.Server]
	var held []*engine.Seq
	s.eng.Running(func(q *engine.Seq) { held = append(held, q) })
	s.eng.Waiting(func(q *engine.Seq) { held = append(held, q) })
	for _, q := range held {
		r.fail(q.Data.(*slot))
	}
	s.loraLoads += s.eng.Stats().LoRALoads
	s.epoch++
	cfg := rs.Engine
	cfg.Coalesce, cfg.MaxLag = true, 0
	eng, err := engine.New(cfg)
	if err != nil {
		panic(fmt.Sprintf("simulate: restart: %v (Run validated it)", err)) // unreachable
	}
	s.eng, s.Engine = eng, rs.Engine
	s.gen++
	s.pending = false
	eps := make([]sched.Endpoint, 0, len(r.servers))
	for _, x := range r.servers {
		eps = append(eps, sched.Endpoint{Addr: x.Addr, MaxBatchedTokens: uint64(x.Engine.MaxNumBatchedTokens), Role: x.Role})
	}
	r.core.SetEndpoints(t, eps)
	r.touch(s)
}

// fail ends a granted request with 503 (its server restarted).
func (r *run) fail(sl *slot) {
	r.res.Outcomes[sl.idx].Status = 503
	r.core.Release(sl.grant, sched.EventDone)
	sl.grant = nil
	r.free = append(r.free, sl)
	r.done++
}
