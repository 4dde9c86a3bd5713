package autothreshold

import (
	"math"
	"time"
)

// Window is the shortest decision window: the controller moves at most
// once per Window, and only on evidence that held at every scrape of it.
// Half a second spans one step of an engine with a full 8192-token budget
// (about 0.4 s) and five scrapes at the picker's default interval.
const Window = int64(500 * time.Millisecond)

// MinScrapes is the fewest scrapes a decision reads.
const MinScrapes = 3

// KVFull is the KV cache usage from which the engine counts as full: it
// admits a request only as finished ones free their cache, and a request
// it is sent meanwhile waits in its own queue, in its order. vLLM admits
// while a prompt's blocks fit (less a 1% watermark); a tenth of the cache
// free still holds several long prompts, so below it the engine is not
// bound by its cache.
const KVFull = 0.9

// UnknownBudget is the start of an endpoint whose step budget is unknown,
// as the busy test assumes for fractions (policy.UnknownMaxBatchedTokens):
// such an endpoint is not made busy until its engine shows a queue.
const UnknownBudget = 10_000_000

// Start is where the threshold starts, and the highest a starved engine
// that is never idle raises it to, as a fraction StartNum/StartDen of the
// step budget B: a step of 7/8 B prompt tokens spends about as large a
// share of its time on the step's fixed cost (the decodes) as a full one,
// so the engine runs within about 1% of its full prefill rate (the README
// workload: 0.2% below), and each step, hence the time to first token,
// is an eighth shorter than at B.
const (
	StartNum = 7
	StartDen = 8
)

// Bounds of the threshold, relative to the step budget B.
const (
	// CeilingFactor: T <= CeilingFactor × B.
	CeilingFactor = 4
	// FloorDivisor: T >= B / FloorDivisor (and >= 1).
	FloorDivisor = 16
)

// Sample is one fresh scrape of the endpoint as the controller reads it.
type Sample struct {
	// At is when the scrape was applied (nanoseconds on the core's clock).
	At int64
	// Waiting is the engine's num_requests_waiting; HasWaiting says the
	// engine reports it (without it the controller holds).
	Waiting    int
	HasWaiting bool
	// Running is the engine's num_requests_running, when HasRunning (an
	// engine without it is never taken as idle).
	Running    int
	HasRunning bool
	// Load is the picker's in-prefill tokens at the endpoint (its busy
	// test's load).
	Load uint64
	// MeanPrompt is the mean prompt (uncached tokens) the picker
	// dispatches; a request in the engine's queue counts as this many.
	MeanPrompt uint64
	// Held says the picker holds requests the endpoint was busy for.
	Held bool
	// KVUsage is the engine's KV cache usage, 0..1, when HasKV.
	KVUsage float64
	HasKV   bool
	// KVTokens is the engine's KV cache in tokens (its block count times
	// its block size; 0: unknown).
	KVTokens uint64
	// AskedOutput is the mean output the requests the picker dispatches
	// asked for (their max_tokens or osl hint; 0: none said).
	AskedOutput uint64
	// GenerationTokens and Finished are the engine's counters of output
	// tokens generated and requests finished, when HasOutput.
	GenerationTokens, Finished float64
	HasOutput                  bool
}

// Move is what one observation did to the threshold.
type Move int8

// Moves.
const (
	Hold Move = iota
	Raise
	Lower
)

func (m Move) String() string {
	switch m {
	case Raise:
		return "raise"
	case Lower:
		return "lower"
	}
	return "hold"
}

// Controller is one endpoint's auto threshold. The zero value is not
// ready; use New.
type Controller struct {
	budget uint64 // step budget, 0 unknown
	t      uint64
	lo, hi uint64
	start  uint64 // StartNum/StartDen of the budget
	// slots is the most requests the engine ran at a scrape that also
	// showed a waiting queue: its sequence limit, as far as seen (0: never
	// seen full).
	slots int

	// The current window: opened at the first sample after a decision.
	open     bool
	winAt    int64
	n        int
	minW     int
	maxW     int
	heldAll  bool
	idleAll  bool // the engine held no request at any scrape of the window
	freeAll  bool // the engine had free sequences and cache at every scrape of the window
	kvFull   bool // the engine's KV cache was full at every scrape of the window
	canJudge bool // every sample of the window had the waiting count

	// The engine's mean output per finished request: decayed sums of the
	// output counters' growth over decision windows (gen/fin), from the
	// counters as last seen (lastGen, lastFin; hasLast).
	gen, fin         float64
	lastGen, lastFin float64
	hasLast          bool
}

// New returns a controller for an endpoint with step budget budget (its
// max_num_batched_tokens; 0: unknown).
func New(budget uint64) *Controller {
	c := &Controller{}
	c.Reset(budget)
	return c
}

// Reset starts over for step budget budget: after an engine restart, or
// when the endpoint's step budget changed.
func (c *Controller) Reset(budget uint64) {
	c.budget = budget
	if budget == 0 {
		c.t, c.lo, c.hi, c.start = UnknownBudget, 1, UnknownBudget, UnknownBudget
	} else {
		c.lo = max(budget/FloorDivisor, 1)
		c.hi = satMul(budget, CeilingFactor)
		c.start = max(satMul(budget, StartNum)/StartDen, c.lo)
		c.t = c.start
	}
	c.open = false
	c.slots = 0
	c.gen, c.fin, c.hasLast = 0, 0, false
}

// Budget is the step budget the controller was reset for (0: unknown).
func (c *Controller) Budget() uint64 { return c.budget }

// Threshold is the threshold in force: the endpoint is busy for an auto
// class when its load is above it.
func (c *Controller) Threshold() uint64 { return c.t }

// Bounds are the lowest and highest thresholds the controller may set.
func (c *Controller) Bounds() (lo, hi uint64) { return c.lo, c.hi }

// Band is the engine waiting queue, in tokens, the rule tolerates for
// mean prompt p: max(B/4, 4p) (B/4 is taken as 0 when B is unknown). Four
// prompts: a picker that dispatches whenever its load is at most T puts
// up to one more prompt in, and a mix of short and long prompts makes a
// few waiting requests count as more or fewer tokens than p each, so a
// narrower band would read that granularity as a queue to lower against.
func (c *Controller) Band(p uint64) uint64 {
	return max(c.budget/4, satMul(max(p, 1), 4))
}

// Observe folds one fresh scrape in and, at the end of a decision window,
// moves the threshold by the rule of the package documentation. It
// reports the move.
func (c *Controller) Observe(s Sample) Move {
	if !c.open {
		c.open, c.winAt, c.n = true, s.At, 0
		c.minW, c.maxW, c.heldAll, c.idleAll, c.freeAll, c.canJudge = s.Waiting, s.Waiting, true, true, true, true
		c.kvFull = true
	}
	if s.HasWaiting && s.HasRunning && s.Waiting > 0 {
		c.slots = max(c.slots, s.Running)
	}
	c.n++
	c.minW, c.maxW = min(c.minW, s.Waiting), max(c.maxW, s.Waiting)
	c.heldAll = c.heldAll && s.Held
	c.idleAll = c.idleAll && s.HasWaiting && s.HasRunning && s.Waiting <= 0 && s.Running <= 0
	// Free sequences: fewer running than 15/16 of the limit seen (with 4
	// sequences, at most 3), or no limit seen yet; and cache below KVFull.
	full := s.HasKV && s.KVUsage >= KVFull
	c.freeAll = c.freeAll && (c.slots == 0 || (s.HasRunning && s.Running*16 < c.slots*15)) && !full
	c.kvFull = c.kvFull && full
	c.canJudge = c.canJudge && s.HasWaiting
	if s.At-c.winAt < Window || c.n < MinScrapes {
		return Hold
	}
	c.open = false
	c.foldOutput(s)
	if !c.canJudge {
		return Hold
	}
	p := max(s.MeanPrompt, 1)
	band := c.Band(p)
	// The decode-bound level (see the package documentation): the
	// threshold that lets the engine take in what its decodes free, when
	// that is below the start.
	bound, decodeBound := c.decodeBound(s, p)
	switch {
	case decodeBound && c.t > satAdd(bound, p) && !(c.idleAll && c.heldAll):
		// The requests will fill the engine's cache before its step
		// budget: prompts beyond what it frees per step would wait in
		// it, in its order. One prompt of slack keeps the mean's jitter
		// from moving the threshold. An engine idle all window while the
		// picker held requests is starved, whatever its cache will do:
		// the raise below takes it.
		c.t = bound
		return Lower
	case c.kvFull && c.minW >= 1:
		// The engine's cache was full and its queue held requests all
		// window long: it admits only as its cache frees, in its own
		// order, so a prompt waiting there gains nothing over waiting in
		// the picker, where the policy orders it. Keep about one prompt
		// ready for the next free space.
		target := max(min(p, subSat(c.t, p)), c.lo)
		if target < c.t {
			c.t = target
			return Lower
		}
	case satMul(uint64(max(c.minW, 0)), p) > band:
		// The engine kept more than the band waiting all window long.
		queued := satMul(uint64(max(s.Waiting, 0)), p)
		intake := subSat(s.Load, queued)
		target := min(satAdd(intake, p), subSat(c.t, p))
		target = max(target, c.lo)
		if target < c.t {
			c.t = target
			return Lower
		}
	case c.heldAll && c.maxW == 0 && c.budget > 0 && (c.idleAll || (c.t < c.start && c.freeAll)):
		// The picker held requests and the engine took every one it was
		// given, all window long: below the start, the threshold starves
		// it if it also had free sequences (an engine whose sequences are
		// all taken gains nothing from more prompts: it is bound by its
		// decodes); above, only an engine seen idle at every scrape is starved
		// (an engine that queues nothing itself, admitting every request
		// it is sent to its running batch, shows no waiting queue at any
		// threshold).
		step := min(max(c.t/8, p), band/2)
		ceiling := c.hi
		if !c.idleAll {
			ceiling = max(c.start, c.t)
			if decodeBound {
				ceiling = max(bound, c.t)
			}
		}
		target := min(satAdd(c.t, step), ceiling)
		if target > c.t {
			c.t = target
			return Raise
		}
	}
	return Hold
}

// MinFinished is the decayed count of finished requests from which the
// engine's own mean output is trusted.
const MinFinished = 4

// foldOutput adds the output counters' growth since the last decision to
// the decayed sums (each window weighs 7/8 of the one before). A counter
// that went back (a restart) starts the sums over.
func (c *Controller) foldOutput(s Sample) {
	if !s.HasOutput {
		c.gen, c.fin, c.hasLast = 0, 0, false
		return
	}
	if c.hasLast && s.GenerationTokens >= c.lastGen && s.Finished >= c.lastFin {
		c.gen = c.gen*7/8 + (s.GenerationTokens - c.lastGen)
		c.fin = c.fin*7/8 + (s.Finished - c.lastFin)
	} else {
		c.gen, c.fin = 0, 0
	}
	c.lastGen, c.lastFin, c.hasLast = s.GenerationTokens, s.Finished, true
}

// Output is the mean output per request the controller expects: what the
// requests asked for, or what the engine's finished requests generated
// when that is less (a max_tokens is a bound, and clients often set it
// far above what they get). 0 without both (no prediction).
func (c *Controller) Output(asked uint64) uint64 {
	if asked == 0 || !c.hasLast {
		return 0
	}
	if c.fin >= MinFinished {
		seen := uint64(math.Ceil(c.gen / c.fin))
		return max(min(asked, seen), 1)
	}
	return asked
}

// decodeBound returns the decode-bound level D and whether it applies.
// With K the engine's cache in tokens and O the expected output, the
// engine holds at most N = K/(p+O) requests, finishes N/O of them per
// step once full, and so takes in x = p·N/O prompt tokens per step; the
// busy test lets one prompt past the threshold, so D = max(x − p, lo).
// It applies when x is below the start (the cache, not the step budget,
// bounds the engine).
func (c *Controller) decodeBound(s Sample, p uint64) (uint64, bool) {
	o := c.Output(s.AskedOutput)
	if o == 0 || s.KVTokens == 0 || c.budget == 0 {
		return 0, false
	}
	n := s.KVTokens / satAdd(p, o)
	x := satMul(p, n) / o
	if x >= c.start {
		return 0, false
	}
	return max(subSat(x, p), c.lo), true
}

func satMul(a, b uint64) uint64 {
	if a != 0 && b > ^uint64(0)/a {
		return ^uint64(0)
	}
	return a * b
}

func satAdd(a, b uint64) uint64 {
	if a > ^uint64(0)-b {
		return ^uint64(0)
	}
	return a + b
}

func subSat(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}
