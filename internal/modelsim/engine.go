package modelsim

import (
	"context"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/laneway-dev/laneway/pkg/tokenize"
)

// Seq states, in Seq.state.
const (
	seqActive   int32 = iota // waiting or running
	seqFinished              // all tokens generated
	seqAborted               // client gone or engine stopped
)

// Seq is one request inside the engine. The handler reads progress through
// Generated and Done; the engine goroutine writes everything else before it
// publishes progress, so a reader that saw a token count sees the times and
// cache numbers that go with it.
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

	hashes []uint64 // full prompt blocks
	order  uint64   // arrival sequence

	// Written by the engine before the progress store that reveals them.
	cachedTokens int
	start        time.Time // admitted (running)
	firstToken   time.Time
	finish       time.Time

	// Engine-owned.
	prefillLeft int
	generated   int
	alloc       allocation

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

// less orders the waiting queue: by priority (lower first) under the
// priority policy, then by arrival.
func less(a, b *Seq, byPriority bool) bool {
	if byPriority && a.Priority != b.Priority {
		return a.Priority < b.Priority
	}
	return a.order < b.order
}

// Engine is the simulated inference engine: one goroutine (run, started by
// Server.Serve) owns the queues, the KV cache and the clock of steps; Submit
// and Abort hand it work through a mutex-guarded inbox.
type Engine struct {
	cfg     Config
	m       *metrics
	records *recordRing

	mu      sync.Mutex
	inbox   []*Seq
	aborts  []*Seq
	stopped bool
	wake    chan struct{} // capacity 1

	nextID     atomic.Uint64
	maxRunning atomic.Int64
	// waitingN counts requests submitted and not yet admitted (inbox
	// included, so the gauge moves the moment a request arrives); runningN
	// mirrors len(running). Gauges read them, so no stale Set can win.
	waitingN atomic.Int64
	runningN atomic.Int64

	// Owned by run.
	waiting    []*Seq // sorted by less
	running    []*Seq // in admission order
	pool       *blockPool
	lastEnd    time.Time // scheduled end of the previous step
	notify     []*Seq    // requests to wake after the next gauge update
	loraLabels string
}

// newEngine returns an engine; Server.Serve runs it.
func newEngine(cfg Config, m *metrics, records *recordRing) *Engine {
	return &Engine{
		cfg:     cfg,
		m:       m,
		records: records,
		wake:    make(chan struct{}, 1),
		pool:    newBlockPool(cfg.NumGPUBlocks, cfg.EnablePrefixCaching),
	}
}

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
}

// blocksFor is the KV blocks a request holds: prompt plus all output tokens.
func (e *Engine) blocksFor(promptTokens, maxTokens int) int {
	bs := e.cfg.BlockSize
	return (promptTokens + maxTokens + bs - 1) / bs
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
	s.order = s.ID
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

// run executes steps until ctx ends, then aborts every request still in the
// engine so their handlers return.
func (e *Engine) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer e.stop()
	for {
		e.takeInbox()
		e.admit()
		if len(e.running) == 0 {
			e.lastEnd = time.Time{} // idle: the next step starts when work comes
			select {
			case <-e.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		prefill, decodes, chunks := e.plan()
		d := e.cfg.scale(float64(prefill) / e.cfg.PrefillTokensPerSec)
		if decodes > 0 {
			d += e.cfg.scale(e.cfg.TimePerOutputToken.Seconds())
		}
		// Busy steps run back to back from their scheduled ends, so timer
		// lateness does not add up over a long generation; after an idle
		// spell (or if far behind) the step starts now.
		now := time.Now()
		start := e.lastEnd
		if start.Before(now.Add(-maxLag)) || start.After(now) {
			start = now
		}
		end := start.Add(d)
		e.lastEnd = end
		if wait := time.Until(end); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return
			}
		}
		e.complete(chunks)
	}
}

// maxLag is how far behind schedule a step may start before the engine
// gives up catching up.
const maxLag = 50 * time.Millisecond

// takeInbox moves submitted requests into the waiting queue and applies
// aborts.
func (e *Engine) takeInbox() {
	e.mu.Lock()
	in, ab := e.inbox, e.aborts
	e.inbox, e.aborts = nil, nil
	e.mu.Unlock()
	byPrio := e.cfg.SchedulingPolicy == PolicyPriority
	for _, s := range in {
		i := sort.Search(len(e.waiting), func(i int) bool { return less(s, e.waiting[i], byPrio) })
		e.waiting = slices.Insert(e.waiting, i, s)
	}
	for _, s := range ab {
		if s.state.Load() != seqActive {
			continue
		}
		if i := slices.Index(e.waiting, s); i >= 0 {
			e.waiting = slices.Delete(e.waiting, i, i+1)
			e.waitingN.Add(-1)
		} else if i := slices.Index(e.running, s); i >= 0 {
			e.running = slices.Delete(e.running, i, i+1)
			e.pool.release(&s.alloc)
		} else {
			// Not reachable: Submit puts a request in the inbox before its
			// handler can abort it, and takeInbox drains both together.
			continue
		}
		s.finish = time.Now()
		e.end(s, seqAborted, "abort")
	}
	e.updateGauges()
}

// admit moves waiting requests into free slots, in queue order. A request
// whose adapter cannot run now is skipped; one whose blocks do not fit stops
// admission (vLLM does both).
func (e *Engine) admit() {
	loras := e.runningLoRAs()
	for i := 0; i < len(e.waiting) && len(e.running) < e.cfg.MaxNumSeqs; {
		s := e.waiting[i]
		if s.LoRA != "" && e.cfg.MaxLoRAs > 0 && !slices.Contains(loras, s.LoRA) && len(loras) >= e.cfg.MaxLoRAs {
			i++
			continue
		}
		// Cache hits cover at most the first PromptTokens-1 tokens: the
		// last prompt token is always computed to produce logits.
		maxHit := min(len(s.hashes), (s.PromptTokens-1)/e.cfg.BlockSize)
		hit := e.pool.match(s.hashes[:max(maxHit, 0)])
		alloc, ok := e.pool.acquire(s.hashes, hit, e.blocksFor(s.PromptTokens, s.MaxTokens))
		if !ok {
			break
		}
		e.waiting = slices.Delete(e.waiting, i, i+1)
		e.waitingN.Add(-1)
		s.alloc = alloc
		s.cachedTokens = hit * e.cfg.BlockSize
		s.prefillLeft = s.PromptTokens - s.cachedTokens
		s.start = time.Now()
		e.running = append(e.running, s)
		if s.LoRA != "" && !slices.Contains(loras, s.LoRA) {
			loras = append(loras, s.LoRA)
		}
		e.m.prefixQueries.Add(float64(s.PromptTokens))
		e.m.prefixHits.Add(float64(s.cachedTokens))
		e.m.queueTime.Observe(s.start.Sub(s.Arrival).Seconds())
		if n := int64(len(e.running)); n > e.maxRunning.Load() {
			e.maxRunning.Store(n)
			e.m.maxRunning.Set(float64(n))
		}
	}
	e.updateGauges()
}

// chunk is the prefill work of one request in a step.
type chunk struct {
	s      *Seq
	tokens int // prefill tokens this step; 0 for a decode
}

// plan fills one step's token budget: decodes first, then prefill chunks in
// admission order.
func (e *Engine) plan() (prefill, decodes int, work []chunk) {
	budget := e.cfg.MaxNumBatchedTokens
	work = make([]chunk, 0, len(e.running))
	for _, s := range e.running {
		if s.prefillLeft == 0 {
			work = append(work, chunk{s: s})
			decodes++
			budget--
		}
	}
	for _, s := range e.running {
		if s.prefillLeft > 0 && budget > 0 {
			n := min(s.prefillLeft, budget)
			work = append(work, chunk{s: s, tokens: n})
			prefill += n
			budget -= n
		}
	}
	return prefill, decodes, work
}

// complete applies a finished step.
func (e *Engine) complete(work []chunk) {
	now := time.Now()
	for _, c := range work {
		s := c.s
		if s.state.Load() != seqActive || !slices.Contains(e.running, s) {
			continue // aborted while the step ran
		}
		if c.tokens > 0 {
			s.prefillLeft -= c.tokens
			if s.prefillLeft > 0 {
				continue
			}
			// Prefill done: its blocks hold a reusable prefix now.
			e.pool.register(&s.alloc, s.hashes, len(s.alloc.hits))
			s.firstToken = now
			e.m.ttft.Observe(now.Sub(s.Arrival).Seconds())
		}
		s.generated++
		e.m.generationTokens.Inc()
		if s.generated >= s.MaxTokens {
			s.finish = now
			e.running = slices.DeleteFunc(e.running, func(x *Seq) bool { return x == s })
			e.pool.release(&s.alloc)
			e.m.promptTokens.Add(float64(s.PromptTokens))
			e.m.success.Inc()
			e.m.e2e.Observe(now.Sub(s.Arrival).Seconds())
			e.end(s, seqFinished, "length")
			continue
		}
		s.progress.Store(int32(s.generated))
		e.notify = append(e.notify, s)
	}
	e.updateGauges()
}

// end publishes a request's last state and records it.
func (e *Engine) end(s *Seq, state int32, reason string) {
	s.progress.Store(int32(s.generated))
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
	for _, list := range [][]*Seq{e.waiting, in, e.running} {
		for _, s := range list {
			if s.state.Load() == seqActive {
				s.finish = now
				e.end(s, seqAborted, "abort")
			}
		}
	}
	e.waiting, e.running = nil, nil
	e.waitingN.Store(0)
	e.updateGauges()
}

func (e *Engine) runningLoRAs() []string {
	var out []string
	for _, s := range e.running {
		if s.LoRA != "" && !slices.Contains(out, s.LoRA) {
			out = append(out, s.LoRA)
		}
	}
	return out
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
	e.runningN.Store(int64(len(e.running)))
	e.m.kvUsage.Set(e.pool.usage())
	if e.cfg.MaxLoRAs > 0 {
		run := e.runningLoRAs()
		var wait []string
		for _, s := range e.waiting {
			if s.LoRA != "" && !slices.Contains(wait, s.LoRA) {
				wait = append(wait, s.LoRA)
			}
		}
		slices.Sort(run)
		slices.Sort(wait)
		r, w := strings.Join(run, ","), strings.Join(wait, ",")
		if key := r + "|" + w; key != e.loraLabels {
			e.loraLabels = key
			e.m.setLoRA(r, w, time.Now())
		}
	}
}
