package modelsim

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/laneway-dev/laneway/pkg/engine"
	"github.com/laneway-dev/laneway/pkg/tokenize"
)

// Seq states, in Seq.state.
const (
	seqActive   int32 = iota // waiting or running
	seqFinished              // all tokens generated
	seqAborted               // client gone or engine stopped
)

// Seq is one request as its HTTP handler sees it. The handler reads
// progress through Generated and Done; the engine goroutine writes
// everything else before it publishes progress, so a reader that saw a
// token count sees the times and cache numbers that go with it.
type Seq struct {
	// ID numbers requests from 1 in order of arrival.
	ID uint64
	// Priority is the request's priority field (lower runs first under
	// the priority policy).
	Priority int
	// PromptTokens is the prompt length in tokens.
	PromptTokens int
	// MaxTokens is the number of tokens the request generates.
	MaxTokens int
	// LoRA is the adapter the request names, or "".
	LoRA string
	// Arrival is when the request reached the server.
	Arrival time.Time
	// RequestID, PrefilledBy and RemoteDecode are the request's part in a
	// disaggregated pool (Record).
	RequestID    string
	PrefilledBy  string
	RemoteDecode bool

	transferred int      // prompt tokens whose KV came from a prefill pod
	hashes      []uint64 // full prompt blocks

	// Engine-owned: the model's request, once submitted.
	es *engine.Seq

	// Written by the engine before the progress store that reveals them.
	cachedTokens int
	start        time.Time // admitted (running)
	firstToken   time.Time
	finish       time.Time

	progress atomic.Int32 // tokens generated so far
	state    atomic.Int32
	notify   chan struct{} // capacity 1: "progress or state changed"
}

// Generated returns how many tokens the request has produced.
func (s *Seq) Generated() int { return int(s.progress.Load()) }

// State reports whether the request finished or was aborted.
func (s *Seq) State() (finished, aborted bool) {
	st := s.state.Load()
	return st == seqFinished, st == seqAborted
}

// Changed is signalled whenever Generated or State may have changed.
func (s *Seq) Changed() <-chan struct{} { return s.notify }

// CachedTokens is the prefix-cache hit of the request; valid once
// Generated() > 0.
func (s *Seq) CachedTokens() int { return s.cachedTokens }

func (s *Seq) signal() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// Engine runs the timing model of pkg/engine on the wall clock: one
// goroutine (run, started by Server.Serve) owns the model and sleeps until
// each step ends; Submit and Abort hand it work through a mutex-guarded
// inbox.
type Engine struct {
	cfg     Config
	m       *metrics
	records *recordRing
	model   *engine.Engine
	epoch   time.Time // the model's clock is nanoseconds since epoch

	mu      sync.Mutex
	inbox   []*Seq
	aborts  []*Seq
	stopped bool
	wake    chan struct{} // capacity 1

	nextID     atomic.Uint64
	maxRunning atomic.Int64
	// waitingN counts requests submitted and not yet admitted (inbox
	// included, so the gauge moves the moment a request arrives); runningN
	// mirrors the model's running count. Gauges read them, so no stale Set
	// can win.
	waitingN atomic.Int64
	runningN atomic.Int64

	// Owned by run.
	events     []engine.Event
	generated  uint64 // model tokens already counted in the metric
	loraLoads  uint64 // model adapter loads already counted in the metric
	notify     []*Seq // requests to wake after the next gauge update
	loraLabels string
}

// newEngine returns an engine; Server.Serve runs it. cfg is valid.
func newEngine(cfg Config, m *metrics, records *recordRing) *Engine {
	ec := cfg.Config
	ec.MaxLag = maxLag
	ec.Coalesce = false // handlers stream one token per step
	model, err := engine.New(ec)
	if err != nil {
		panic("modelsim: " + err.Error()) // New validated cfg
	}
	return &Engine{
		cfg:     cfg,
		m:       m,
		records: records,
		model:   model,
		epoch:   time.Now(),
		wake:    make(chan struct{}, 1),
	}
}

// maxLag is how far behind schedule a step may start before the engine
// gives up catching up.
const maxLag = 50 * time.Millisecond

// MaxRunning is the largest number of requests that ever ran at once.
func (e *Engine) MaxRunning() int { return int(e.maxRunning.Load()) }

// Request is what Submit needs to know about a request.
type Request struct {
	// Tokens are the prompt's token ids; they are hashed, not kept.
	Tokens []uint32
	// MaxTokens is how many tokens to generate (at least 1).
	MaxTokens int
	// Priority orders the waiting queue under the priority policy.
	Priority int
	// LoRA names the adapter, or is "" for the base model.
	LoRA string
	// Arrival is when the request reached the server (zero: now), so
	// latency metrics include parsing and tokenization, as vLLM's do.
	Arrival time.Time
	// Transferred is how many prompt tokens' KV arrived from a prefill pod
	// (a disaggregated request); PrefilledBy names that pod. RequestID and
	// RemoteDecode are recorded as they are (Record).
	Transferred  int
	PrefilledBy  string
	RequestID    string
	RemoteDecode bool
}

// Submit queues a request. It reports false when the engine has stopped.
func (e *Engine) Submit(r Request) (*Seq, bool) {
	s := &Seq{
		ID:           e.nextID.Add(1),
		Priority:     r.Priority,
		PromptTokens: len(r.Tokens),
		MaxTokens:    r.MaxTokens,
		LoRA:         r.LoRA,
		Arrival:      r.Arrival,
		RequestID:    r.RequestID,
		PrefilledBy:  r.PrefilledBy,
		RemoteDecode: r.RemoteDecode,
		transferred:  r.Transferred,
		notify:       make(chan struct{}, 1),
	}
	if s.Arrival.IsZero() {
		s.Arrival = time.Now()
	}
	if e.cfg.EnablePrefixCaching {
		s.hashes = tokenize.BlockHashes(r.Tokens, e.cfg.BlockSize)
	}
	e.mu.Lock()
	if e.stopped {
		e.mu.Unlock()
		return nil, false
	}
	e.inbox = append(e.inbox, s)
	e.mu.Unlock()
	e.waitingN.Add(1)
	e.kick()
	return s, true
}

// Abort takes a request out (its client went away). It is a no-op for a
// request that already ended.
func (e *Engine) Abort(s *Seq) {
	e.mu.Lock()
	e.aborts = append(e.aborts, s)
	e.mu.Unlock()
	e.kick()
}

func (e *Engine) kick() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// now is the model's clock.
func (e *Engine) now() int64 { return int64(time.Since(e.epoch)) }

// run executes steps until ctx ends, then aborts every request still in the
// engine so their handlers return.
func (e *Engine) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer e.stop()
	for {
		now := e.now()
		e.events = e.model.Advance(now, e.events[:0])
		e.apply(e.events)
		e.publishProgress()
		e.updateGauges()
		e.takeInbox(now)
		var wake int64
		var busy bool
		e.events, wake, busy = e.model.Schedule(now, e.events[:0])
		e.apply(e.events)
		e.updateGauges()
		if !busy {
			select {
			case <-e.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		if wait := time.Duration(wake - e.now()); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return
			}
		}
	}
}

// takeInbox hands submitted requests to the model, in arrival order, and
// applies aborts.
func (e *Engine) takeInbox(now int64) {
	e.mu.Lock()
	in, ab := e.inbox, e.aborts
	e.inbox, e.aborts = nil, nil
	e.mu.Unlock()
	slices.SortFunc(in, func(a, b *Seq) int { return cmp.Compare(a.ID, b.ID) })
	for _, s := range in {
		es, err := e.model.Submit(now, engine.Request{
			PromptTokens: s.PromptTokens, Hashes: s.hashes, MaxTokens: s.MaxTokens,
			Priority: s.Priority, LoRA: s.LoRA, TransferredTokens: s.transferred, Data: s,
		})
		s.hashes = nil
		if err != nil {
			// Not reachable: the handler checked max_model_len, and
			// Validate bounds it by the cache.
			e.waitingN.Add(-1)
			s.finish = time.Now()
			e.end(s, seqAborted, "abort")
			continue
		}
		s.es = es
	}
	for _, s := range ab {
		if s.state.Load() != seqActive || s.es == nil {
			// Ended, or (not reachable: Submit puts a request in the inbox
			// before its handler can abort it, and takeInbox drains both
			// together) never submitted.
			continue
		}
		wasWaiting := s.es.State() == engine.Waiting
		if !e.model.Abort(now, s.es) {
			continue
		}
		if wasWaiting {
			e.waitingN.Add(-1)
		}
		s.finish = time.Now()
		e.end(s, seqAborted, "abort")
	}
	// No updateGauges here: run's next step is Schedule and then one,
	// with nothing in between that blocks.
}

// apply turns the model's events into request state, records and metrics.
func (e *Engine) apply(evs []engine.Event) {
	if len(evs) == 0 {
		return
	}
	now := time.Now()
	for _, ev := range evs {
		s := ev.Seq.Data.(*Seq)
		switch ev.Kind {
		case engine.Started:
			e.waitingN.Add(-1)
			s.cachedTokens = ev.Seq.CachedTokens
			s.start = now
			e.m.prefixQueries.Add(float64(s.PromptTokens))
			e.m.prefixHits.Add(float64(s.cachedTokens))
			e.m.queueTime.Observe(s.start.Sub(s.Arrival).Seconds())
		case engine.FirstToken:
			s.firstToken = now
			e.m.ttft.Observe(now.Sub(s.Arrival).Seconds())
			// As vLLM v1 counts it: the whole prompt, at the step that
			// finished its prefill (what a picker reconciles against).
			e.m.promptTokens.Add(float64(s.PromptTokens))
		case engine.Done:
			s.finish = now
			e.m.success.Inc()
			e.m.e2e.Observe(now.Sub(s.Arrival).Seconds())
			e.end(s, seqFinished, "length")
		}
	}
	st := e.model.Stats()
	if n := int64(st.MaxRunning); n > e.maxRunning.Load() {
		e.maxRunning.Store(n)
		e.m.maxRunning.Set(float64(n))
	}
	if st.GeneratedTokens > e.generated {
		e.m.generationTokens.Add(float64(st.GeneratedTokens - e.generated))
		e.generated = st.GeneratedTokens
	}
	if st.LoRALoads > e.loraLoads {
		e.m.loraLoads.Add(float64(st.LoRALoads - e.loraLoads))
		e.loraLoads = st.LoRALoads
	}
}

// publishProgress makes each running request's new tokens visible to its
// handler.
func (e *Engine) publishProgress() {
	e.model.Running(func(es *engine.Seq) {
		s := es.Data.(*Seq)
		if g := int32(e.model.Generated(es)); g != s.progress.Load() {
			s.progress.Store(g)
			e.notify = append(e.notify, s)
		}
	})
}

// end publishes a request's last state and records it.
func (e *Engine) end(s *Seq, state int32, reason string) {
	gen := s.MaxTokens
	if s.es != nil {
		gen = e.model.Generated(s.es)
	} else if state != seqFinished {
		gen = 0
	}
	s.progress.Store(int32(gen))
	s.state.Store(state)
	e.notify = append(e.notify, s)
	if state == seqAborted {
		e.m.aborted.Inc()
	}
	e.records.add(recordOf(s, reason))
}

// stop aborts everything left once run returns.
func (e *Engine) stop() {
	e.mu.Lock()
	e.stopped = true
	in := e.inbox
	e.inbox = nil
	e.mu.Unlock()
	now := time.Now()
	var left []*Seq
	e.model.Waiting(func(es *engine.Seq) { left = append(left, es.Data.(*Seq)) })
	left = append(left, in...)
	e.model.Running(func(es *engine.Seq) { left = append(left, es.Data.(*Seq)) })
	for _, s := range left {
		if s.state.Load() == seqActive {
			s.finish = now
			e.end(s, seqAborted, "abort")
		}
	}
	e.waitingN.Store(0)
	e.updateGauges()
}

// updateGauges publishes the engine state to the metrics, then wakes the
// handlers of requests that changed: a client that has seen its token finds
// the metrics already updated.
func (e *Engine) updateGauges() {
	defer func() {
		for _, s := range e.notify {
			s.signal()
		}
		clear(e.notify)
		e.notify = e.notify[:0]
	}()
	st := e.model.Stats()
	e.runningN.Store(int64(st.Running))
	e.m.kvUsage.Set(st.KVUsage())
	if e.cfg.MaxLoRAs > 0 {
		run, wait := e.model.AdapterNames()
		r, w := strings.Join(run, ","), strings.Join(wait, ",")
		if key := r + "|" + w; key != e.loraLabels {
			e.loraLabels = key
			e.m.setLoRA(r, w, time.Now())
		}
	}
}
