package load

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/internal/testbed/load/h2client"
)

// Bounds on a soak: longer than a latency run, still bounded.
const (
	MaxSoakDuration = 24 * time.Hour
	MaxSoakRequests = 50_000_000
)

// Soak is a long open-loop run that looks for what only time shows: memory
// that grows, goroutines that stay behind, a request answered twice or
// never. Requests arrive at a fixed rate through the event-driven gateway
// (h2client) while the caller's Actions change the picker's world on
// their own schedules (endpoint churn, policy changes); every request's
// answers and ends are counted by its arrival index, and the picker's
// memory and goroutines are sampled throughout.
type Soak struct {
	// Addr is the picker's ext_proc address; TLS, when set, speaks TLS.
	Addr string
	TLS  *tls.Config
	// Headers holds one set of request headers per HTTP/2 connection
	// (for example one policy class each); arrivals alternate between the
	// connections, so each set gets an equal share. At least one.
	Headers []http.Header
	// Sample reads the picker's state; required.
	Sample func(ctx context.Context) (Sample, error)
	// Actions run on their own tickers while requests arrive.
	Actions []Action
	// Progress, when set, hears every sample as it is taken.
	Progress func(Sample)
	// Goroutines, when set, counts the picker's goroutines exactly for
	// the idle samples before (after false) and after the load (for
	// example from its goroutine profile, which can also be kept to tell
	// what stayed behind). go_goroutines, which Sample reads, is taken
	// while the registry's collectors run on goroutines of their own, and
	// moves by a few from one scrape to the next.
	Goroutines func(ctx context.Context, after bool) (int, error)
}

// Action is something a soak does to the picker's world every Every:
// Do's n counts its calls from 0. An error is counted and reported, and
// the soak goes on.
type Action struct {
	Name  string
	Every time.Duration
	Do    func(ctx context.Context, n int) error
}

// SoakConfig describes one soak.
type SoakConfig struct {
	// Rate, Hold, Duration and PromptTokens are as in Config; Duration is
	// bounded by MaxSoakDuration instead.
	Rate         float64
	Hold         time.Duration
	Duration     time.Duration
	PromptTokens int
	// HeaderOnly is as in Config: no response phases.
	HeaderOnly bool
	// SharedPromptTokens of each prompt are the same in every request (a
	// system prompt, which the picker's prefix index sees as cached); the
	// rest differ per request.
	SharedPromptTokens int
	// SampleEvery is the sampling period (at least one sample is taken
	// during the load).
	SampleEvery time.Duration
	// Settle bounds the wait after the last stream ended for the picker's
	// goroutines to come back to their number before the load.
	Settle time.Duration
}

// Validate checks the bounds of a soak.
func (c *SoakConfig) Validate() error {
	var errs []error
	if c.Rate <= 0 || c.Rate > MaxRate {
		errs = append(errs, fmt.Errorf("rate %g: want (0, %d] per second", c.Rate, MaxRate))
	}
	if c.Duration <= 0 || c.Duration > MaxSoakDuration {
		errs = append(errs, fmt.Errorf("soak duration %s: want (0, %s]", c.Duration, MaxSoakDuration))
	}
	if n := c.Rate * c.Duration.Seconds(); n > MaxSoakRequests {
		errs = append(errs, fmt.Errorf("rate %g for %s is %.0f requests, more than %d", c.Rate, c.Duration, n, MaxSoakRequests))
	}
	if c.Hold < 0 || c.Hold > MaxHold {
		errs = append(errs, fmt.Errorf("hold %s: want [0, %s]", c.Hold, MaxHold))
	}
	if c.PromptTokens <= 0 || c.PromptTokens > 1<<20 {
		errs = append(errs, fmt.Errorf("prompt tokens %d: want 1..%d", c.PromptTokens, 1<<20))
	}
	if c.SharedPromptTokens < 0 {
		errs = append(errs, fmt.Errorf("shared prompt tokens %d: want >= 0", c.SharedPromptTokens))
	}
	if c.SampleEvery <= 0 {
		errs = append(errs, fmt.Errorf("sample period %s: want > 0", c.SampleEvery))
	}
	if c.Settle < 0 {
		errs = append(errs, fmt.Errorf("settle %s: want >= 0", c.Settle))
	}
	return errors.Join(errs...)
}

// Sample is the picker's state at one moment of a soak.
type Sample struct {
	// At is the time since the first arrival (0 before it).
	At time.Duration
	// RSSBytes is the picker's resident set; HeapBytes its Go heap in use.
	RSSBytes, HeapBytes float64
	// Goroutines is the picker's goroutine count.
	Goroutines int
	// Queued is the requests waiting in the picker's queues.
	Queued float64
	// Streams is the ext_proc streams the picker has counted, whatever
	// their outcome.
	Streams float64
	// Open is the streams the soak had open.
	Open int
}

// PickerSample reads a Sample from the picker's Prometheus page at addr
// ("host:port"): the process collector's RSS, the Go collector's heap in
// use and goroutines, and the queue gauges. Each sample is a connection
// of its own, closed after it, so that no idle keep-alive connection of
// the sampler's counts among the picker's goroutines.
func PickerSample(addr string) func(ctx context.Context) (Sample, error) {
	page := launch.PageAt(addr)
	return func(ctx context.Context) (Sample, error) {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		body, err := getOnce(ctx, string(page))
		if err != nil {
			return Sample{}, err
		}
		m, err := launch.ParseMetrics(bytes.NewReader(body))
		if err != nil {
			return Sample{}, fmt.Errorf("%s: %w", page, err)
		}
		rss, ok1 := m.Sum("process_resident_memory_bytes")
		heap, ok2 := m.Sum("go_memstats_heap_inuse_bytes")
		g, ok3 := m.Sum("go_goroutines")
		if !ok1 || !ok2 || !ok3 {
			return Sample{}, fmt.Errorf("%s lacks process_resident_memory_bytes, go_memstats_heap_inuse_bytes or go_goroutines", page)
		}
		return Sample{RSSBytes: rss, HeapBytes: heap, Goroutines: int(g), Queued: m.Value("dynamo_frontend_router_queue_pending_requests"),
			Streams: m.Value("laneway_extproc_streams_total")}, nil
	}
}

// oneShot makes every request on a connection of its own.
var oneShot = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}

// getOnce GETs url on a connection that is closed afterwards and returns
// the body of a 200.
func getOnce(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	resp, err := oneShot.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return body, nil
}

// ProfileGoroutines is a Soak.Goroutines for a picker serving pprof at
// addr ("host:port"): the total of its goroutine profile, each profile
// written to before or after (grouped by stack; the last one of the
// settle wait is what stays in after) when those paths are not empty.
func ProfileGoroutines(addr, before, after string) func(ctx context.Context, after bool) (int, error) {
	return func(ctx context.Context, isAfter bool) (int, error) {
		body, err := getOnce(ctx, "http://"+addr+"/debug/pprof/goroutine?debug=1")
		if err != nil {
			return 0, err
		}
		line, _, _ := strings.Cut(string(body), "\n")
		n, err := strconv.Atoi(strings.TrimPrefix(line, "goroutine profile: total "))
		if err != nil {
			return 0, fmt.Errorf("goroutine profile of %s: first line %q", addr, line)
		}
		if path := map[bool]string{false: before, true: after}[isAfter]; path != "" {
			if err := os.WriteFile(path, body, 0o644); err != nil {
				return 0, err
			}
		}
		return n, nil
	}
}

// ActionCount is how often an action ran and failed.
type ActionCount struct {
	Runs, Errors int
	FirstError   string
}

// SoakResult is what a soak observed.
type SoakResult struct {
	// Load is the open loop's result: requests started, routed, answered
	// directly by status, errors, decision latency.
	Load Result
	// AnsweredOnce counts started requests that got exactly one answer and
	// ended once without an error; Unanswered got no answer, AnsweredTwice
	// more than one; EndedTwice ended more than once, Unended never, and
	// Failed ended with an error (after an answer or not).
	AnsweredOnce, Unanswered, AnsweredTwice, EndedTwice, Unended, Failed int
	// Before is the picker idle before the load's connections opened;
	// After idle after they closed and the goroutines settled (or Settle
	// passed).
	Before, After Sample
	// Samples are the samples taken while requests arrived.
	Samples []Sample
	// Actions counts each action's runs and errors.
	Actions map[string]ActionCount
	// SampleErrors counts samples that could not be read.
	SampleErrors int
}

// ExactlyOnce reports whether every started request was answered once
// and ended once, cleanly.
func (r *SoakResult) ExactlyOnce() bool {
	return r.Load.Started > 0 && r.AnsweredOnce == r.Load.Started
}

// Warm is the first sample at least warm into the load (the last sample
// when none is): the baseline of memory growth, after the picker's
// buffers, caches and histograms have been filled once.
func (r *SoakResult) Warm(warm time.Duration) Sample {
	for _, s := range r.Samples {
		if s.At >= warm {
			return s
		}
	}
	return r.End()
}

// End is the last sample taken while requests arrived.
func (r *SoakResult) End() Sample {
	if len(r.Samples) == 0 {
		return Sample{}
	}
	return r.Samples[len(r.Samples)-1]
}

// Peak is the sample with the largest RSS.
func (r *SoakResult) Peak() Sample {
	var p Sample
	for _, s := range r.Samples {
		if s.RSSBytes > p.RSSBytes {
			p = s
		}
	}
	return p
}

// RSSSlope is the least-squares slope of RSS over the samples from warm
// on, in bytes per hour: growth that a start-versus-end pair can hide
// behind a garbage collection.
func (r *SoakResult) RSSSlope(warm time.Duration) float64 {
	var n, sx, sy, sxx, sxy float64
	for _, s := range r.Samples {
		if s.At < warm {
			continue
		}
		x := s.At.Hours()
		n++
		sx += x
		sy += s.RSSBytes
		sxx += x * x
		sxy += x * s.RSSBytes
	}
	if d := n*sxx - sx*sx; n >= 2 && d != 0 {
		return (n*sxy - sx*sy) / d
	}
	return 0
}

// Run runs the soak and waits for every stream to end and the picker to
// settle.
func (k *Soak) Run(ctx context.Context, cfg SoakConfig) (SoakResult, error) {
	if err := cfg.Validate(); err != nil {
		return SoakResult{}, err
	}
	if len(k.Headers) == 0 || k.Sample == nil {
		return SoakResult{}, errors.New("soak: Headers and Sample are required")
	}
	total := int(cfg.Rate * cfg.Duration.Seconds())
	run := &h2Run{s: &stats{byStatus: map[int]int{}, lat: make([]time.Duration, 0, total)}, tags: make([]tagCount, total)}
	each := make([]h2client.Options, len(k.Headers))
	for i, h := range k.Headers {
		spec := specFor(&Config{PromptTokens: cfg.PromptTokens, Headers: h})
		first, err := h2client.NewPlan(soakExchange(spec, cfg, 0))
		if err != nil {
			return SoakResult{}, err
		}
		each[i].PlanOf = func(tag int) *h2client.Plan {
			p, err := h2client.NewPlan(soakExchange(spec, cfg, tag))
			if err != nil {
				return first // only the prompt's numbers differ from first's, which encoded
			}
			return p
		}
	}
	// Before and After are taken with none of the load's connections
	// open: what the picker keeps per connection (and a connection the
	// load opens while a first one is busy) is then in neither, and a
	// difference is what the soak left behind.
	res := SoakResult{Actions: map[string]ActionCount{}}
	var err error
	if res.Before, err = k.idleSample(ctx, false); err != nil {
		return SoakResult{}, fmt.Errorf("soak: sample before the load: %w", err)
	}
	res.Before.At = 0
	conns, err := run.dial(ctx, k.Addr, k.TLS, each, cfg.Hold)
	defer closeAll(conns)
	if err != nil {
		return SoakResult{}, err
	}

	// Actions and the sampler run while requests arrive.
	bgCtx, stopBg := context.WithCancel(ctx)
	var bg sync.WaitGroup
	var mu sync.Mutex // guards res.Samples, res.Actions, res.SampleErrors
	t0 := time.Now()
	for _, a := range k.Actions {
		bg.Add(1)
		go func() {
			defer bg.Done()
			every(bgCtx, a.Every, func(n int) {
				err := a.Do(bgCtx, n)
				mu.Lock()
				c := res.Actions[a.Name]
				c.Runs++
				if err != nil && bgCtx.Err() == nil {
					c.Errors++
					if c.FirstError == "" {
						c.FirstError = err.Error()
					}
				}
				res.Actions[a.Name] = c
				mu.Unlock()
			})
		}()
	}
	sample := func() {
		s, err := k.Sample(bgCtx)
		s.At, s.Open = time.Since(t0), int(run.s.open.Load())
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			if bgCtx.Err() == nil {
				res.SampleErrors++
			}
			return
		}
		res.Samples = append(res.Samples, s)
		if k.Progress != nil {
			k.Progress(s)
		}
	}
	bg.Add(1)
	go func() {
		defer bg.Done()
		every(bgCtx, cfg.SampleEvery, func(int) { sample() })
	}()

	base := &Runner{}
	lcfg := Config{Rate: cfg.Rate, Hold: cfg.Hold, Duration: cfg.Duration, PromptTokens: cfg.PromptTokens, HeaderOnly: cfg.HeaderOnly}
	res.Load, err = base.openLoop(ctx, &lcfg, run.s, func(i int) {
		run.s.mu.Lock()
		run.tags[i].started = true
		run.s.mu.Unlock()
		run.pending.Add(1)
		conns[i%len(conns)].Start(i)
	}, func() {
		// The last sample is taken as the last request arrives, so that
		// End is under load even when the period does not divide the run.
		sample()
		stopBg()
		bg.Wait()
		waitOrCancel(ctx, &run.pending, conns)
	})
	stopBg()
	bg.Wait()
	sort.Slice(res.Samples, func(i, j int) bool { return res.Samples[i].At < res.Samples[j].At })
	if err != nil {
		return res, fmt.Errorf("soak cancelled: %w", err)
	}
	run.s.mu.Lock()
	for _, c := range run.tags {
		if c.started {
			res.count(c)
		}
	}
	run.s.mu.Unlock()
	closeAll(conns)
	res.After, err = k.settle(ctx, res.Before.Goroutines, cfg.Settle)
	res.After.At = time.Since(t0)
	if err != nil {
		return res, fmt.Errorf("soak: sample after the load: %w", err)
	}
	return res, nil
}

// soakExchange is request tag's exchange: spec with a prompt of its own
// after the shared prefix.
func soakExchange(spec extprocclient.RequestSpec, cfg SoakConfig, tag int) h2client.Exchange {
	return h2client.Exchange{
		Path: spec.Path, Headers: spec.Headers, Body: BodyFor(cfg.PromptTokens, min(cfg.SharedPromptTokens, cfg.PromptTokens), tag),
		ResponseStatus: http.StatusOK, ResponseHeaders: responseHeaders, ResponseBody: responseChunk,
		HeaderOnly: cfg.HeaderOnly,
	}
}

// count adds one request's outcome.
func (r *SoakResult) count(c tagCount) {
	switch {
	case c.answers == 0:
		r.Unanswered++
	case c.answers > 1:
		r.AnsweredTwice++
	}
	switch {
	case c.ends == 0:
		r.Unended++
	case c.ends > 1:
		r.EndedTwice++
	}
	if c.failed {
		r.Failed++
	}
	if c.answers == 1 && c.ends == 1 && !c.failed {
		r.AnsweredOnce++
	}
}

// settle samples the picker until its goroutines are back to want or
// limit passed, and returns the last sample.
func (k *Soak) settle(ctx context.Context, want int, limit time.Duration) (Sample, error) {
	deadline := time.Now().Add(limit)
	for {
		s, err := k.idleSample(ctx, true)
		if err != nil {
			return s, err
		}
		if s.Goroutines <= want || !time.Now().Before(deadline) {
			return s, nil
		}
		t := time.NewTimer(250 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return s, ctx.Err()
		}
	}
}

// idleSample is a Sample with the exact goroutine count when Goroutines
// is set.
func (k *Soak) idleSample(ctx context.Context, after bool) (Sample, error) {
	s, err := k.Sample(ctx)
	if err != nil || k.Goroutines == nil {
		return s, err
	}
	s.Goroutines, err = k.Goroutines(ctx, after)
	return s, err
}

// every calls f(0), f(1), ... once per period until ctx ends, the first
// call one period in.
func every(ctx context.Context, period time.Duration, f func(n int)) {
	t := time.NewTicker(period)
	defer t.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f(n)
	}
}

// String renders a soak's figures as a labelled report; warm is the
// baseline offset of memory growth (see Warm).
func (r *SoakResult) String(warm time.Duration) string {
	mib := func(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }
	var b strings.Builder
	l := &r.Load
	fmt.Fprintf(&b, "SOAK rate=%g/s hold=%s duration=%s\n", l.Rate, l.Hold, l.Duration)
	fmt.Fprintf(&b, "  requests: %d sent, %d routed, %d answered directly %v, %d transport/protocol errors, %d skipped at the cap\n",
		l.Started, l.Routed, l.Immediate, l.ByStatus, l.Errors, l.Skipped)
	fmt.Fprintf(&b, "  exactly once: %d of %d answered once and ended once (unanswered %d, answered twice %d, never ended %d, ended twice %d, failed %d)\n",
		r.AnsweredOnce, l.Started, r.Unanswered, r.AnsweredTwice, r.Unended, r.EndedTwice, r.Failed)
	fmt.Fprintf(&b, "  decision latency: p50 %.3fms p99 %.3fms max %.3fms; max schedule lag %.3fms\n",
		ms(l.Latency.P50), ms(l.Latency.P99), ms(l.Latency.Max), ms(l.MaxLag))
	w, p, e, f := r.Warm(warm), r.Peak(), r.End(), r.Warm(0)
	fmt.Fprintf(&b, "  picker RSS: idle before %s; first sample (%s) %s; at %s %s; peak %s at %s; end of load %s; idle after %s\n",
		mib(r.Before.RSSBytes), f.At.Round(time.Second), mib(f.RSSBytes), w.At.Round(time.Second), mib(w.RSSBytes),
		mib(p.RSSBytes), p.At.Round(time.Second), mib(e.RSSBytes), mib(r.After.RSSBytes))
	fmt.Fprintf(&b, "  picker RSS growth from %s to the end of the load: %s (least-squares slope over that window %s/h)\n",
		w.At.Round(time.Second), mib(e.RSSBytes-w.RSSBytes), mib(r.RSSSlope(warm)))
	fmt.Fprintf(&b, "  picker heap in use: at %s %s; end of load %s; idle after %s\n",
		w.At.Round(time.Second), mib(w.HeapBytes), mib(e.HeapBytes), mib(r.After.HeapBytes))
	fmt.Fprintf(&b, "  picker goroutines: %d before the load, %d at its end, %d after (%+d)\n",
		r.Before.Goroutines, e.Goroutines, r.After.Goroutines, r.After.Goroutines-r.Before.Goroutines)
	names := make([]string, 0, len(r.Actions))
	for n := range r.Actions {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		a := r.Actions[n]
		fmt.Fprintf(&b, "  action %s: %d runs, %d errors", n, a.Runs, a.Errors)
		if a.FirstError != "" {
			fmt.Fprintf(&b, " (first: %s)", a.FirstError)
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "  samples: %d during the load, %d failed\n", len(r.Samples), r.SampleErrors)
	for _, e := range l.FirstErrors {
		b.WriteString("  error: " + e + "\n")
	}
	return b.String()
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
