package load

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
)

// Bounds on a run, so a typo cannot start an unbounded loop.
const (
	MaxDuration    = 10 * time.Minute
	MaxRate        = 100_000
	MaxConcurrency = 50_000
	MaxRequests    = 10_000_000
	MaxHold        = time.Minute
)

// Config describes one run.
type Config struct {
	// Rate is the open loop's arrivals per second.
	Rate float64
	// Concurrency is the closed loop's number of streams kept busy.
	Concurrency int
	// Hold is how long a routed request stays open before its response
	// phases are played back.
	Hold time.Duration
	// Duration bounds the run: the open loop's arrival window, the closed
	// loop's time to keep starting requests.
	Duration time.Duration
	// ConcurrencyCap bounds the open loop's open streams; an arrival above
	// it is skipped (and counted). 0 means MaxConcurrency.
	ConcurrencyCap int
	// PromptTokens is the prompt length of every request (a token-id
	// prompt, so the picker counts it exactly).
	PromptTokens int
	// Headers are extra request headers (for example a class header).
	Headers http.Header
	// HeaderOnly plays a gateway that sends no response phase: each
	// stream is half-closed after the request and is over when the
	// picker ends it after its answer, so Hold does not apply. Runner's
	// clients must then have a header-only extprocclient.Shape.
	HeaderOnly bool
}

// Validate checks the bounds of a run.
func (c *Config) Validate(closed bool) error {
	var errs []error
	if closed {
		if c.Concurrency <= 0 || c.Concurrency > MaxConcurrency {
			errs = append(errs, fmt.Errorf("concurrency %d: want 1..%d", c.Concurrency, MaxConcurrency))
		}
	} else {
		if c.Rate <= 0 || c.Rate > MaxRate {
			errs = append(errs, fmt.Errorf("rate %g: want (0, %d] per second", c.Rate, MaxRate))
		}
		if n := c.Rate * c.Duration.Seconds(); n > MaxRequests {
			errs = append(errs, fmt.Errorf("rate %g for %s is %.0f requests, more than %d", c.Rate, c.Duration, n, MaxRequests))
		}
	}
	if c.Duration <= 0 || c.Duration > MaxDuration {
		errs = append(errs, fmt.Errorf("duration %s: want (0, %s]", c.Duration, MaxDuration))
	}
	if c.Hold < 0 || c.Hold > MaxHold {
		errs = append(errs, fmt.Errorf("hold %s: want [0, %s]", c.Hold, MaxHold))
	}
	if c.ConcurrencyCap < 0 || c.ConcurrencyCap > MaxConcurrency {
		errs = append(errs, fmt.Errorf("concurrency cap %d: want 0..%d", c.ConcurrencyCap, MaxConcurrency))
	}
	if c.PromptTokens <= 0 || c.PromptTokens > 1<<20 {
		errs = append(errs, fmt.Errorf("prompt tokens %d: want 1..%d", c.PromptTokens, 1<<20))
	}
	return errors.Join(errs...)
}

// Result is what a run observed.
type Result struct {
	// Mode is "open" or "closed".
	Mode string
	// HeaderOnly reports a run without response phases (Config.HeaderOnly).
	HeaderOnly  bool
	Rate        float64
	Concurrency int
	Hold        time.Duration
	Duration    time.Duration

	// Started counts requests sent; Routed got a pick; Immediate were
	// answered directly (by status in ByStatus); Errors failed at the
	// transport or protocol level; Skipped arrivals found ConcurrencyCap
	// streams open.
	Started, Routed, Immediate, Errors, Skipped int
	ByStatus                                    map[int]int
	// FirstErrors holds a few error messages for the report.
	FirstErrors []string

	// Latency is the decision latency distribution of every answered
	// request.
	Latency Summary
	// Wire is the same decisions' latency to the kernel's receive
	// timestamp of the answer (h2 driver on Linux; N 0 otherwise): what the
	// picker and the loopback hop took, without the load tool waking up to
	// read it.
	Wire Summary
	// Elapsed is from the first arrival to the last stream's end.
	Elapsed time.Duration
	// DecisionsPerSec is answered requests per second of the arrival
	// window (open loop) or of the whole run (closed loop).
	DecisionsPerSec float64
	// PeakOpen is the most streams open at once.
	PeakOpen int
	// MaxLag is the open loop's worst delay of an arrival behind its
	// schedule (the load tool falling behind, not the picker).
	MaxLag time.Duration

	// PickerCPU is the CPU seconds the picker used during the run and
	// PickerCPUPer1000 the same per 1,000 decisions; HasPickerCPU is false
	// (and both zero) when no sampler was given or it failed.
	HasPickerCPU     bool
	PickerCPU        float64
	PickerCPUPer1000 float64
	// LoadCPU is this process's CPU seconds during the run.
	LoadCPU float64
}

// Summary is a latency distribution.
type Summary struct {
	N                  int
	P50, P90, P99, Max time.Duration
	Mean               time.Duration
}

// Summarize computes the distribution of ds (which it sorts).
func Summarize(ds []time.Duration) Summary {
	if len(ds) == 0 {
		return Summary{}
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return Summary{
		N:    len(ds),
		P50:  quantile(ds, 0.50),
		P90:  quantile(ds, 0.90),
		P99:  quantile(ds, 0.99),
		Max:  ds[len(ds)-1],
		Mean: sum / time.Duration(len(ds)),
	}
}

// quantile is the nearest-rank quantile of sorted ds: the smallest value
// with at least q of the samples at or below it.
func quantile(sorted []time.Duration, q float64) time.Duration {
	rank := int(q*float64(len(sorted))+0.999999999) - 1
	rank = max(0, min(rank, len(sorted)-1))
	return sorted[rank]
}

// CPUSampler returns a process's cumulative CPU seconds.
type CPUSampler func() (float64, error)

// Runner drives load through gateway clients (several, to spread streams
// over connections as a multi-worker gateway does).
type Runner struct {
	// Clients are used round-robin; at least one.
	Clients []*extprocclient.Client
	// PickerCPU, when set, samples the picker's CPU before and after.
	PickerCPU CPUSampler
	// Trace, when set, receives one line per answered request: its start
	// (seconds since the run began) and decision latency (ms), for
	// looking at stalls over time.
	Trace io.Writer
}

// stats collects per-request outcomes from many goroutines.
type stats struct {
	mu        sync.Mutex
	lat       []time.Duration
	wire      []time.Duration
	routed    int
	immediate int
	errs      int
	byStatus  map[int]int
	firstErrs []string

	open, peak atomic.Int64

	t0    time.Time
	trace []tracePoint
}

type tracePoint struct {
	start time.Duration
	lat   time.Duration
}

func (s *stats) enter() {
	n := s.open.Add(1)
	for {
		p := s.peak.Load()
		if n <= p || s.peak.CompareAndSwap(p, n) {
			return
		}
	}
}

func (s *stats) leave() { s.open.Add(-1) }

func (s *stats) fail(err error) {
	s.mu.Lock()
	s.errs++
	if len(s.firstErrs) < 5 {
		s.firstErrs = append(s.firstErrs, err.Error())
	}
	s.mu.Unlock()
}

// one plays one request: start, record the decision, hold, respond, close.
func (r *Runner) one(ctx context.Context, c *extprocclient.Client, spec extprocclient.RequestSpec, hold time.Duration, s *stats) {
	begin := time.Since(s.t0)
	ex, err := c.Start(ctx, spec)
	if err != nil {
		s.fail(err)
		return
	}
	defer ex.Close()
	d := ex.Decision()
	s.mu.Lock()
	s.lat = append(s.lat, d.Latency)
	if r.Trace != nil {
		s.trace = append(s.trace, tracePoint{begin, d.Latency})
	}
	if d.Routed() {
		s.routed++
	} else {
		s.immediate++
		s.byStatus[d.Immediate.Status]++
	}
	s.mu.Unlock()
	if !d.Routed() || ex.Ended() {
		return // answered directly, or a header-only stream already over
	}
	if hold > 0 {
		t := time.NewTimer(hold)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return // the run was cancelled: the deferred Close resets the stream
		}
	}
	if _, _, err := ex.Respond(http.StatusOK, responseHeaders, responseChunk); err != nil {
		s.fail(fmt.Errorf("response phase: %w", err))
		return
	}
	if err := ex.Close(); err != nil {
		s.fail(err)
	}
}

var (
	responseHeaders = http.Header{"content-type": {"text/event-stream"}}
	responseChunk   = []byte("data: {\"choices\":[{\"text\":\"x\",\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n")
)

// Body returns a completions body with a token-id prompt of n tokens.
func Body(n int) []byte { return BodyFor(n, n, 0) }

// BodyFor returns a completions body with a token-id prompt of n tokens
// whose first shared tokens are Body's (a system prompt every request
// repeats) and whose rest is distinct for each seed, as real prompts are:
// a prefix cache then holds the shared part only.
func BodyFor(n, shared, seed int) []byte {
	prompt := make([]int, n)
	for i := range prompt {
		if i < shared {
			prompt[i] = 1 + (i*7919)%50000
		} else {
			prompt[i] = 1 + (seed*104729+i*31)%50000
		}
	}
	b, err := json.Marshal(map[string]any{"model": "loadgen", "prompt": prompt, "max_tokens": 1, "stream": true})
	if err != nil {
		panic(fmt.Sprintf("marshal load body: %v", err)) // ints and strings only
	}
	return b
}

// checkClients makes sure the clients play the response phases exactly
// when cfg asks for them.
func (r *Runner) checkClients(cfg *Config) error {
	if len(r.Clients) == 0 {
		return errors.New("load: no clients")
	}
	for _, c := range r.Clients {
		if c.Shape().ResponsePhases() == cfg.HeaderOnly {
			return fmt.Errorf("load: a %s client in a run with header-only %t", c.Shape(), cfg.HeaderOnly)
		}
	}
	return nil
}

func specFor(cfg *Config) extprocclient.RequestSpec {
	h := http.Header{"content-type": {"application/json"}}
	for k, v := range cfg.Headers {
		h[k] = append([]string(nil), v...)
	}
	return extprocclient.RequestSpec{Path: "/v1/completions", Headers: h, Body: Body(cfg.PromptTokens)}
}

func (r *Runner) sampleCPU() (float64, bool) {
	if r.PickerCPU == nil {
		return 0, false
	}
	v, err := r.PickerCPU()
	if err != nil {
		return 0, false
	}
	return v, true
}

func (r *Runner) finish(res *Result, s *stats, cpu0 float64, cpuOK bool, self0 float64) {
	res.Routed, res.Immediate, res.Errors = s.routed, s.immediate, s.errs
	res.ByStatus = s.byStatus
	res.FirstErrors = s.firstErrs
	res.Latency = Summarize(s.lat)
	res.Wire = Summarize(s.wire)
	res.PeakOpen = int(s.peak.Load())
	if cpu1, ok := r.sampleCPU(); ok && cpuOK {
		res.HasPickerCPU = true
		res.PickerCPU = cpu1 - cpu0
		if n := res.Routed + res.Immediate; n > 0 {
			res.PickerCPUPer1000 = res.PickerCPU / float64(n) * 1000
		}
	}
	res.LoadCPU = selfCPU() - self0
	if r.Trace != nil {
		sort.Slice(s.trace, func(i, j int) bool { return s.trace[i].start < s.trace[j].start })
		w := bufio.NewWriter(r.Trace)
		fmt.Fprintf(w, "# %s run: start_s latency_ms\n", res.Mode)
		for _, p := range s.trace {
			fmt.Fprintf(w, "%.6f %.3f\n", p.start.Seconds(), float64(p.lat)/float64(time.Millisecond))
		}
		_ = w.Flush() // a trace is best effort
	}
}

// RunOpen runs the open loop of SPEC §13 and waits for every stream to end.
func (r *Runner) RunOpen(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.Validate(false); err != nil {
		return Result{}, err
	}
	if err := r.checkClients(&cfg); err != nil {
		return Result{}, err
	}
	spec := specFor(&cfg)
	s := newOpenStats(&cfg)
	var wg sync.WaitGroup
	return r.openLoop(ctx, &cfg, s, func(i int) {
		c := r.Clients[i%len(r.Clients)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer s.leave()
			r.one(ctx, c, spec, cfg.Hold, s)
		}()
	}, wg.Wait)
}

// newOpenStats sizes a run's stats for its arrivals.
func newOpenStats(cfg *Config) *stats {
	return &stats{byStatus: map[int]int{}, lat: make([]time.Duration, 0, int(cfg.Rate*cfg.Duration.Seconds()))}
}

// openLoop is the arrival schedule both open-loop drivers share: arrival i
// is due at i/Rate from the start, whatever the picker does, and launch(i)
// starts it unless ConcurrencyCap streams are open (it is then skipped and
// counted, never delayed). launch must call s.leave when the stream ends.
// wait returns once every launched stream has ended; openLoop then fills
// in the Result.
func (r *Runner) openLoop(ctx context.Context, cfg *Config, s *stats, launch func(i int), wait func()) (Result, error) {
	capN := cfg.ConcurrencyCap
	if capN == 0 {
		capN = MaxConcurrency
	}
	total := int(cfg.Rate * cfg.Duration.Seconds())
	interval := time.Duration(float64(time.Second) / cfg.Rate)
	res := Result{Mode: "open", HeaderOnly: cfg.HeaderOnly, Rate: cfg.Rate, Hold: cfg.Hold, Duration: cfg.Duration}

	cpu0, cpuOK := r.sampleCPU()
	self0 := selfCPU()
	start := time.Now()
	s.t0 = start
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	var lastArrival time.Time
	for i := 0; i < total; i++ {
		due := start.Add(time.Duration(i) * interval)
		if wait := time.Until(due); wait > 0 {
			t.Reset(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			break
		}
		lastArrival = time.Now()
		if lag := lastArrival.Sub(due); lag > res.MaxLag {
			res.MaxLag = lag
		}
		if int(s.open.Load()) >= capN {
			res.Skipped++
			continue
		}
		res.Started++
		s.enter()
		launch(i)
	}
	window := lastArrival.Sub(start)
	wait()
	res.Elapsed = time.Since(start)
	r.finish(&res, s, cpu0, cpuOK, self0)
	if window > 0 {
		// Arrivals i = 0..n-1 span (n-1) intervals.
		res.DecisionsPerSec = float64(res.Routed+res.Immediate) / (window + interval).Seconds()
	}
	return res, ctx.Err()
}

// RunClosed keeps cfg.Concurrency streams busy for cfg.Duration: each
// worker starts its next request when the previous one ends.
func (r *Runner) RunClosed(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.Validate(true); err != nil {
		return Result{}, err
	}
	if err := r.checkClients(&cfg); err != nil {
		return Result{}, err
	}
	spec := specFor(&cfg)
	s := &stats{byStatus: map[int]int{}}
	res := Result{Mode: "closed", HeaderOnly: cfg.HeaderOnly, Concurrency: cfg.Concurrency, Hold: cfg.Hold, Duration: cfg.Duration}
	var started atomic.Int64

	cpu0, cpuOK := r.sampleCPU()
	self0 := selfCPU()
	start := time.Now()
	s.t0 = start
	deadline := start.Add(cfg.Duration)
	var wg sync.WaitGroup
	for w := 0; w < cfg.Concurrency; w++ {
		c := r.Clients[w%len(r.Clients)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) && ctx.Err() == nil {
				if started.Add(1) > MaxRequests {
					return
				}
				s.enter()
				r.one(ctx, c, spec, cfg.Hold, s)
				s.leave()
			}
		}()
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	res.Started = int(min(started.Load(), MaxRequests))
	r.finish(&res, s, cpu0, cpuOK, self0)
	res.DecisionsPerSec = float64(res.Routed+res.Immediate) / res.Elapsed.Seconds()
	return res, ctx.Err()
}

// String renders a result as a short labelled report.
func (res *Result) String() string {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.3fms", float64(d)/float64(time.Millisecond)) }
	var head string
	if res.Mode == "open" {
		head = fmt.Sprintf("OPEN LOOP rate=%g/s hold=%s duration=%s (about %.0f streams open)",
			res.Rate, res.Hold, res.Duration, res.Rate*res.Hold.Seconds())
	} else {
		head = fmt.Sprintf("CLOSED LOOP concurrency=%d hold=%s duration=%s (throughput run; latency = N/throughput)",
			res.Concurrency, res.Hold, res.Duration)
	}
	if res.HeaderOnly {
		head += "\n  header-only: no response phases, each stream ends with the picker's answer (hold unused)"
	}
	out := head + "\n" +
		fmt.Sprintf("  requests: %d started, %d routed, %d answered directly %v, %d errors, %d skipped at the concurrency cap\n",
			res.Started, res.Routed, res.Immediate, res.ByStatus, res.Errors, res.Skipped) +
		fmt.Sprintf("  decision latency: p50 %s  p90 %s  p99 %s  max %s  (mean %s, n=%d)\n",
			ms(res.Latency.P50), ms(res.Latency.P90), ms(res.Latency.P99), ms(res.Latency.Max), ms(res.Latency.Mean), res.Latency.N)
	if res.Wire.N > 0 {
		out += fmt.Sprintf("  on the wire:      p50 %s  p90 %s  p99 %s  max %s  (mean %s, n=%d; to the kernel's receive timestamp)\n",
			ms(res.Wire.P50), ms(res.Wire.P90), ms(res.Wire.P99), ms(res.Wire.Max), ms(res.Wire.Mean), res.Wire.N)
	}
	out +=
		fmt.Sprintf("  decisions/s %.1f; peak open streams %d; elapsed %s", res.DecisionsPerSec, res.PeakOpen, res.Elapsed.Round(time.Millisecond))
	if res.Mode == "open" {
		out += fmt.Sprintf("; max schedule lag %s", ms(res.MaxLag))
	}
	out += "\n"
	if res.HasPickerCPU {
		out += fmt.Sprintf("  picker CPU: %.3f s, %.4f s per 1,000 decisions; load tool CPU %.3f s\n",
			res.PickerCPU, res.PickerCPUPer1000, res.LoadCPU)
	} else {
		out += fmt.Sprintf("  picker CPU: not sampled; load tool CPU %.3f s\n", res.LoadCPU)
	}
	for _, e := range res.FirstErrors {
		out += "  error: " + e + "\n"
	}
	return out
}
