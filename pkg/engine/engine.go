package engine

import (
	"errors"
	"fmt"
	"slices"

	"github.com/laneway-dev/laneway/pkg/iheap"
)

// State is where a request is in the engine.
type State uint8

const (
	// Waiting: submitted, not admitted to a running slot.
	Waiting State = iota
	// Prefilling: running, prompt not fully computed.
	Prefilling
	// Decoding: running, first token emitted.
	Decoding
	// Finished: every output token emitted.
	Finished
	// Aborted: taken out by Abort before it finished.
	Aborted
)

// String names the state.
func (s State) String() string {
	switch s {
	case Waiting:
		return "waiting"
	case Prefilling:
		return "prefilling"
	case Decoding:
		return "decoding"
	case Finished:
		return "finished"
	case Aborted:
		return "aborted"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Request is what Submit needs to know about a request.
type Request struct {
	// PromptTokens is the prompt length in tokens (at least 1).
	PromptTokens int
	// Hashes are the chained hashes of the prompt's full blocks at
	// Config.BlockSize (pkg/tokenize's BlockHashes): what the prefix
	// cache matches and stores. Nil: nothing of the prompt is cacheable.
	// The engine reads them until the request's prefill is done.
	Hashes []uint64
	// MaxTokens is how many tokens to generate (at least 1).
	MaxTokens int
	// Priority orders the waiting queue under the priority policy (lower
	// first, ties by arrival).
	Priority int
	// LoRA names the adapter, or is "" for the base model.
	LoRA string
	// TransferredTokens are prompt tokens whose KV cache arrives with the
	// request, computed elsewhere (the prefill pod of a disaggregated
	// request): they count as cached, up to PromptTokens-1 (the last
	// prompt token is always computed here).
	TransferredTokens int
	// Data is the driver's handle; the engine never reads it.
	Data any
}

// Seq is one request inside the engine. Its exported fields are the
// driver's to read (not to write) on the engine's goroutine.
type Seq struct {
	Request
	// ID numbers requests from 1 in order of Submit.
	ID uint64
	// Arrival is the time of Submit; Start (admitted to a slot),
	// FirstToken and Finish (the last token, or the abort) are valid once
	// State has passed them.
	Arrival, Start, FirstToken, Finish int64
	// CachedTokens is the prefix-cache hit, known from Start.
	CachedTokens int

	state       State
	admitted    uint64 // admission order
	prefillLeft int
	firstStep   int64 // step count when the first token was emitted
	generated   int   // frozen at finish and abort
	alloc       allocation
}

// State returns where the request is.
func (s *Seq) State() State { return s.state }

// EventKind says what happened to a request.
type EventKind uint8

const (
	// Started: admitted to a running slot; CachedTokens is known.
	Started EventKind = iota
	// FirstToken: prefill complete, the first token emitted.
	FirstToken
	// Done: the last token emitted (after FirstToken, possibly in the
	// same step).
	Done
)

// String names the event kind.
func (k EventKind) String() string {
	switch k {
	case Started:
		return "started"
	case FirstToken:
		return "first-token"
	case Done:
		return "done"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event is one thing that happened to one request at one time.
type Event struct {
	Kind EventKind
	Seq  *Seq
	At   int64
}

// chunk is the prefill work of one request in a step.
type chunk struct {
	s      *Seq
	tokens int
}

// step is the step in progress: k sub-steps of d nanoseconds each from
// start (k > 1 only for a coalesced stretch of decode-only steps).
type step struct {
	active     bool
	start, end int64
	k, d       int64
	chunks     []chunk
}

// The decoding requests wait in a heap by their last step: a request
// finishes when the step count reaches it. Its key is that step (finishKey;
// steps are never negative, the sign flip only keeps the order honest),
// ties go to the earlier admission. Entries of aborted requests stay until
// popped.

func newFinishHeap() iheap.Heap[*Seq] { return iheap.New(admittedFirst) }

func admittedFirst(a, b *Seq) bool { return a.admitted < b.admitted }

// finishKey is the heap key of last step step; finishStep its inverse.
func finishKey(step int64) uint64 { return uint64(step) ^ 1<<63 }

func finishStep(key uint64) int64 { return int64(key ^ 1<<63) }

// Engine is the timing model of one model server (see the package
// documentation). One goroutine owns it; it reads no clock.
type Engine struct {
	cfg  Config
	pool *blockPool

	nextID   uint64
	admitted uint64

	waiting waitQueue
	// pf holds the prefilling requests in admission order from pfHead
	// (aborted ones are skipped lazily): prefill completes in this order.
	pf     []*Seq
	pfHead int
	// fin is a min-heap of the decoding requests by their last steps.
	fin iheap.Heap[*Seq]

	running, prefilling, decoding int
	loras                         map[string]int // running requests per adapter
	slots                         adapterSlots   // resident adapters (lora.go)

	cur     step
	steps   int64 // completed steps (a coalesced stretch counts all of its)
	lastEnd int64 // end of the last completed step while busy
	hasLast bool  // the engine has been busy since lastEnd

	maxRunning int
	generated  uint64
	// promptTokens counts the prompts whose prefill completed, as vLLM
	// v1's prompt_tokens_total does.
	promptTokens uint64
	// finished counts the requests that finished (not aborted), as
	// vLLM's request_success_total does.
	finished uint64
}

// New returns an engine for cfg.
func New(cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("engine config: %w", err)
	}
	return &Engine{
		cfg:     cfg,
		pool:    newBlockPool(cfg.NumGPUBlocks, cfg.EnablePrefixCaching),
		waiting: waitQueue{byPriority: cfg.SchedulingPolicy == PolicyPriority},
		fin:     newFinishHeap(),
		loras:   map[string]int{},
	}, nil
}

// Config returns the engine's configuration.
func (e *Engine) Config() Config { return e.cfg }

// Errors of Submit.
var (
	ErrEmptyPrompt = errors.New("engine: a request needs at least one prompt token")
	ErrNoTokens    = errors.New("engine: a request must generate at least one token")
)

// TooLargeError is Submit's answer to a request the KV cache can never
// hold: it would wait forever.
type TooLargeError struct {
	Blocks, Capacity int
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("engine: the request needs %d KV blocks, the cache has %d", e.Blocks, e.Capacity)
}

// Submit queues a request that arrived at now. It joins the first step that
// starts after the call: the one the next Schedule starts if the engine is
// between steps, else the one after the step in progress. Call Advance(now)
// before Submit(now): a step that has ended must be completed first.
func (e *Engine) Submit(now int64, r Request) (*Seq, error) {
	switch {
	case r.PromptTokens < 1:
		return nil, ErrEmptyPrompt
	case r.MaxTokens < 1:
		return nil, ErrNoTokens
	}
	if need := e.cfg.Blocks(r.PromptTokens, r.MaxTokens); need > e.cfg.NumGPUBlocks {
		return nil, &TooLargeError{Blocks: need, Capacity: e.cfg.NumGPUBlocks}
	}
	e.interrupt(now)
	if !e.cfg.EnablePrefixCaching {
		r.Hashes = nil
	}
	e.nextID++
	s := &Seq{Request: r, ID: e.nextID, Arrival: now}
	e.waiting.push(s)
	return s, nil
}

// Abort takes a request out at now (its client went away): it leaves the
// waiting queue or frees its slot and blocks. It reports false for a
// request that already ended. Call Advance(now) first, as for Submit.
func (e *Engine) Abort(now int64, s *Seq) bool {
	switch s.state {
	case Finished, Aborted:
		return false
	}
	e.interrupt(now)
	s.generated = e.Generated(s)
	switch s.state {
	case Waiting:
		e.waiting.remove(s)
	case Prefilling:
		e.prefilling--
		e.release(s)
	case Decoding:
		e.decoding--
		e.release(s)
	}
	s.state = Aborted
	s.Finish = now
	s.Hashes = nil
	return true
}

// release frees a running request's slot and blocks.
func (e *Engine) release(s *Seq) {
	e.running--
	e.pool.release(&s.alloc)
	if s.LoRA != "" {
		if e.loras[s.LoRA]--; e.loras[s.LoRA] == 0 {
			delete(e.loras, s.LoRA)
		}
	}
}

// interrupt cuts a coalesced stretch at now, so that a change (Submit,
// Abort) takes effect where one-step-at-a-time would have taken it: at the
// end of the sub-step in progress, or at once when now is a sub-step
// boundary (the stretch's finished sub-steps emit nothing but tokens).
func (e *Engine) interrupt(now int64) {
	c := &e.cur
	if !c.active {
		return
	}
	if now > c.end {
		panic(fmt.Sprintf("engine: a call at %d while the step ending at %d is not completed: call Advance first", now, c.end))
	}
	if c.k <= 1 || c.d <= 0 {
		return
	}
	// The sub-steps finished by now emit only tokens: account for them,
	// so the stretch left is the one sub-step in progress.
	if done := (now - c.start) / c.d; done > 0 {
		e.steps += done
		e.generated += uint64(e.decoding) * uint64(done)
		c.start += done * c.d
		e.lastEnd, e.hasLast = c.start, true
		if c.start == now {
			c.active = false // at a boundary: between steps
			return
		}
	}
	c.k = 1
	c.end = c.start + c.d
}

// Advance completes the step in progress if it ends at or before now and
// appends its events to out: the requests that finished (in admission
// order), then those whose prefill completed (FirstToken, and Done for a
// one-token request). It does not start the next step: Schedule does.
func (e *Engine) Advance(now int64, out []Event) []Event {
	c := &e.cur
	if !c.active || c.end > now {
		return out
	}
	c.active = false
	end := c.end
	e.steps += c.k
	e.lastEnd, e.hasLast = end, true
	e.generated += uint64(e.decoding) * uint64(c.k)
	for e.fin.Len() > 0 {
		s := e.fin.At(0)
		if s.state != Decoding {
			e.fin.Pop() // aborted
			continue
		}
		if finishStep(e.fin.Key(0)) > e.steps {
			break
		}
		e.fin.Pop()
		e.decoding--
		out = e.finish(s, end, out)
	}
	for _, ch := range c.chunks {
		s := ch.s
		if s.state != Prefilling {
			continue // aborted while the step ran
		}
		s.prefillLeft -= ch.tokens
		if s.prefillLeft > 0 {
			continue
		}
		// Prefill done: its blocks hold a reusable prefix now.
		e.pool.register(&s.alloc, s.Hashes, len(s.alloc.hits))
		s.Hashes = nil
		s.FirstToken = end
		e.prefilling--
		e.generated++
		e.promptTokens += uint64(s.PromptTokens)
		out = append(out, Event{Kind: FirstToken, Seq: s, At: end})
		if s.MaxTokens <= 1 {
			out = e.finish(s, end, out)
			continue
		}
		s.state = Decoding
		s.firstStep = e.steps
		e.decoding++
		e.fin.Push(finishKey(e.steps+int64(s.MaxTokens)-1), s, nil)
	}
	clear(c.chunks)
	c.chunks = c.chunks[:0]
	for e.pfHead < len(e.pf) && e.pf[e.pfHead].state != Prefilling {
		e.pf[e.pfHead] = nil
		e.pfHead++
	}
	if e.pfHead == len(e.pf) {
		e.pf, e.pfHead = e.pf[:0], 0
	} else if e.pfHead > 64 && e.pfHead*2 > len(e.pf) {
		n := copy(e.pf, e.pf[e.pfHead:])
		clear(e.pf[n:])
		e.pf, e.pfHead = e.pf[:n], 0
	}
	return out
}

// finish ends a running request at now.
func (e *Engine) finish(s *Seq, now int64, out []Event) []Event {
	s.state = Finished
	s.generated = s.MaxTokens
	s.Finish = now
	e.finished++
	e.release(s)
	return append(out, Event{Kind: Done, Seq: s, At: now})
}

// Schedule starts the next step at now if none is in progress and some
// request runs: it first admits waiting requests into free slots, in queue
// order (a request whose adapter cannot run now is skipped; one whose
// blocks do not fit stops admission, as vLLM does), appending a Started
// event for each to out. It returns the end of the step in progress, the
// time the driver must call Advance; ok is false when the engine is idle.
func (e *Engine) Schedule(now int64, out []Event) (_ []Event, wake int64, ok bool) {
	if e.cur.active {
		return out, e.cur.end, true
	}
	out = e.admit(now, out)
	if e.running == 0 {
		e.hasLast = false // idle: the next step starts when work comes
		return out, 0, false
	}
	start := now
	if e.hasLast && e.lastEnd <= now && now-e.lastEnd <= int64(e.cfg.MaxLag) {
		start = e.lastEnd
	}
	// Decodes take one token each; the rest of the budget goes to prefill
	// chunks in admission order (chunked prefill).
	budget := e.cfg.MaxNumBatchedTokens - e.decoding
	prefill := 0
	c := &e.cur
	for i := e.pfHead; i < len(e.pf) && budget > 0; i++ {
		s := e.pf[i]
		if s.state != Prefilling {
			continue
		}
		n := min(s.prefillLeft, budget)
		c.chunks = append(c.chunks, chunk{s: s, tokens: n})
		prefill += n
		budget -= n
	}
	c.active, c.start, c.k = true, start, 1
	load := e.takeLoadTime() // adapters loaded for this step (lora.go)
	c.d = int64(e.cfg.stepTime(prefill, e.decoding > 0)) + load
	if prefill == 0 && load == 0 && e.cfg.Coalesce {
		// Decode only: nothing changes until the next finish, or until a
		// Submit or Abort cuts the stretch.
		for e.fin.At(0).state != Decoding {
			e.fin.Pop()
		}
		c.k = max(1, finishStep(e.fin.Key(0))-e.steps)
	}
	c.end = start + c.k*c.d
	return out, c.end, true
}

// admit moves waiting requests into free slots.
func (e *Engine) admit(now int64, out []Event) []Event {
	q := &e.waiting
	for i := q.head; i < len(q.items) && e.running < e.cfg.MaxNumSeqs; {
		s := q.items[i]
		if s.LoRA != "" && e.cfg.MaxLoRAs > 0 && e.loras[s.LoRA] == 0 && len(e.loras) >= e.cfg.MaxLoRAs {
			i++
			continue
		}
		// Cache hits cover at most the first PromptTokens-1 tokens: the
		// last prompt token is always computed to produce logits.
		maxHit := min(len(s.Hashes), (s.PromptTokens-1)/e.cfg.BlockSize)
		hit := e.pool.match(s.Hashes[:max(maxHit, 0)])
		alloc, ok := e.pool.acquire(s.Hashes, hit, e.cfg.Blocks(s.PromptTokens, s.MaxTokens))
		if !ok {
			break
		}
		i = q.removeAt(i)
		s.alloc = alloc
		s.CachedTokens = max(hit*e.cfg.BlockSize, min(s.TransferredTokens, s.PromptTokens-1))
		s.prefillLeft = s.PromptTokens - s.CachedTokens
		s.Start = now
		s.state = Prefilling
		e.admitted++
		s.admitted = e.admitted
		e.pf = append(e.pf, s)
		e.running++
		e.prefilling++
		if s.LoRA != "" {
			e.useAdapter(s.LoRA)
			e.loras[s.LoRA]++
		}
		e.maxRunning = max(e.maxRunning, e.running)
		out = append(out, Event{Kind: Started, Seq: s, At: now})
	}
	return out
}

// Generated returns how many tokens s has produced so far.
func (e *Engine) Generated(s *Seq) int {
	switch s.state {
	case Decoding:
		return int(1 + e.steps - s.firstStep)
	case Finished, Aborted:
		return s.generated
	}
	return 0
}

// Stats are the engine's counters and gauges.
type Stats struct {
	// Waiting and Running count requests; MaxRunning is the most that
	// ever ran at once.
	Waiting, Running, MaxRunning int
	// Steps counts completed steps; GeneratedTokens every token emitted;
	// PromptTokens the prompt tokens of every request whose prefill
	// completed (vLLM v1's prompt_tokens_total).
	Steps           int64
	GeneratedTokens uint64
	PromptTokens    uint64
	// Finished counts the requests that finished, not aborted (vLLM's
	// request_success_total).
	Finished uint64
	// UsedBlocks are held by running requests; CachedBlocks are idle
	// blocks holding a cached prefix; TotalBlocks is the cache size.
	UsedBlocks, CachedBlocks, TotalBlocks int
	// LoRALoads counts adapters loaded into a slot.
	LoRALoads uint64
}

// KVUsage is the fraction of blocks running requests hold (vLLM's
// kv_cache_usage_perc: idle cached blocks count as free).
func (s Stats) KVUsage() float64 { return float64(s.UsedBlocks) / float64(s.TotalBlocks) }

// Stats returns the counters now.
func (e *Engine) Stats() Stats {
	return Stats{
		Waiting: e.waiting.len(), Running: e.running, MaxRunning: e.maxRunning,
		Steps: e.steps, GeneratedTokens: e.generated, PromptTokens: e.promptTokens,
		Finished:   e.finished,
		UsedBlocks: e.pool.used, CachedBlocks: e.pool.lruLen, TotalBlocks: e.pool.total,
		LoRALoads: e.slots.loads,
	}
}

// Running calls f for every running request (in no particular order).
func (e *Engine) Running(f func(*Seq)) {
	for _, s := range e.pf[e.pfHead:] {
		if s.state == Prefilling {
			f(s)
		}
	}
	for i := range e.fin.Len() {
		if s := e.fin.At(i); s.state == Decoding {
			f(s)
		}
	}
}

// Waiting calls f for every waiting request, in queue order.
func (e *Engine) Waiting(f func(*Seq)) {
	for _, s := range e.waiting.items[e.waiting.head:] {
		f(s)
	}
}

// AdapterNames returns the adapters of the running and the waiting
// requests, each sorted, for vLLM's lora_requests_info series. O(n).
func (e *Engine) AdapterNames() (running, waiting []string) {
	for a := range e.loras {
		running = append(running, a)
	}
	e.Waiting(func(s *Seq) {
		if s.LoRA != "" && !slices.Contains(waiting, s.LoRA) {
			waiting = append(waiting, s.LoRA)
		}
	})
	slices.Sort(running)
	slices.Sort(waiting)
	return running, waiting
}

// waitQueue is the waiting requests sorted by (priority under the priority
// policy, then ID) from head. Under FCFS every push appends and every
// admission pops the head: O(1).
type waitQueue struct {
	items      []*Seq
	head       int
	byPriority bool
}

func (q *waitQueue) len() int { return len(q.items) - q.head }

func (q *waitQueue) less(a, b *Seq) bool {
	if q.byPriority && a.Priority != b.Priority {
		return a.Priority < b.Priority
	}
	return a.ID < b.ID
}

// search returns the first index from head whose request does not sort
// before s.
func (q *waitQueue) search(s *Seq) int {
	lo, hi := q.head, len(q.items)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if q.less(q.items[m], s) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

func (q *waitQueue) push(s *Seq) {
	if n := len(q.items); n == q.head || q.less(q.items[n-1], s) {
		q.items = append(q.items, s)
		return
	}
	q.items = slices.Insert(q.items, q.search(s), s)
}

func (q *waitQueue) remove(s *Seq) {
	if i := q.search(s); i < len(q.items) && q.items[i] == s {
		q.removeAt(i)
	}
}

// removeAt removes the request at index i and returns the index of the
// one that followed it.
func (q *waitQueue) removeAt(i int) int {
	if i == q.head {
		q.items[i] = nil
		q.head++
		if q.head == len(q.items) {
			q.items, q.head = q.items[:0], 0
		} else if q.head > 64 && q.head*2 > len(q.items) {
			n := copy(q.items, q.items[q.head:])
			clear(q.items[n:])
			q.items, q.head = q.items[:n], 0
		}
		return q.head
	}
	q.items = slices.Delete(q.items, i, i+1)
	return i
}
