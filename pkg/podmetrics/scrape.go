package podmetrics

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// Sink receives what the scraper learns about an endpoint. It is called from
// the scraper's goroutines (one per endpoint, and the staleness timers), at
// most once at a time per endpoint and in order; it should hand the value
// over and return.
type Sink interface {
	// SetEndpointMetrics delivers a fresh scrape (stale false), or reports
	// that the endpoint's last good scrape is older than the staleness bound
	// (stale true; m is that last scrape, or zero if there was none).
	SetEndpointMetrics(addr string, m Metrics, stale bool)
}

// Target is one endpoint to scrape.
type Target struct {
	// Addr is the endpoint's "ip:port"; its page is http://Addr/metrics,
	// where vLLM, SGLang and trtllm-serve serve it next to the API.
	Addr string
	// Engine names the page's series.
	Engine Engine
}

// ScrapeOptions configure a Scraper. Zero durations take the defaults
// below.
type ScrapeOptions struct {
	// Interval is the time between the starts of two scrapes of one
	// endpoint (default 100ms). A scrape that takes longer delays the next.
	Interval time.Duration
	// Staleness is how old an endpoint's last good scrape may get before
	// the endpoint counts as stale (default 2 × Interval). Age runs from the
	// start of that scrape, so a pod whose /metrics stops answering is stale
	// at most Staleness after it stopped.
	Staleness time.Duration
	// Timeout bounds one scrape (default Staleness): a page that comes later
	// would be stale on arrival.
	Timeout time.Duration
	// MaxPageBytes bounds a page (default 8 MiB); a larger one fails.
	MaxPageBytes int64
	// Transport makes the requests; nil means a transport of the scraper's
	// own that keeps one idle connection per endpoint.
	Transport http.RoundTripper
	// Log receives one line per state change of an endpoint, at
	// verbosity 2.
	Log logr.Logger
}

// Defaults of ScrapeOptions.
const (
	DefaultScrapeInterval = 100 * time.Millisecond
	defaultMaxPageBytes   = 8 << 20
)

// withDefaults fills the zero fields.
func (o ScrapeOptions) withDefaults() ScrapeOptions {
	if o.Interval <= 0 {
		o.Interval = DefaultScrapeInterval
	}
	if o.Staleness <= 0 {
		o.Staleness = 2 * o.Interval
	}
	if o.Timeout <= 0 {
		o.Timeout = o.Staleness
	}
	if o.MaxPageBytes <= 0 {
		o.MaxPageBytes = defaultMaxPageBytes
	}
	return o
}

// Validate reports settings that cannot work: a staleness bound shorter
// than the interval would make every endpoint stale between two healthy
// scrapes.
func (o ScrapeOptions) Validate() error {
	o = o.withDefaults()
	if o.Staleness < o.Interval {
		return fmt.Errorf("metrics staleness %s is shorter than the scrape interval %s: every endpoint would go stale between two scrapes", o.Staleness, o.Interval)
	}
	return nil
}

// Scraper polls the /metrics page of every target on a goroutine per
// target, parses it with Parse and hands the result to a Sink. It tracks
// staleness: a target whose last good scrape is older than the staleness
// bound is reported stale once, by a timer, so a page that hangs is noticed
// even while its request is still open. A target never scraped successfully
// is unknown, which a Sink should treat like stale.
//
// A Scraper is a prometheus.Collector of per-target series:
// laneway_endpoint_metrics_stale, laneway_scrape_errors_total,
// laneway_scrapes_total and the engine's last waiting and running counts.
type Scraper struct {
	sink   Sink
	opts   ScrapeOptions
	client *http.Client
	own    *http.Transport // closed by Stop when the scraper made it

	mu      sync.Mutex
	targets map[string]*target
	stopped bool
	wg      sync.WaitGroup
}

// NewScraper returns a scraper delivering to sink; it scrapes nothing until
// SetTargets.
func NewScraper(sink Sink, o ScrapeOptions) (*Scraper, error) {
	if sink == nil {
		return nil, errors.New("podmetrics: scraper needs a sink")
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o = o.withDefaults()
	s := &Scraper{sink: sink, opts: o, targets: map[string]*target{}}
	rt := o.Transport
	if rt == nil {
		s.own = &http.Transport{
			// Endpoints are pod addresses: never through an environment
			// proxy.
			DialContext:         (&net.Dialer{Timeout: o.Timeout}).DialContext,
			MaxIdleConnsPerHost: 1,
			IdleConnTimeout:     time.Minute,
			// Pages are small and mostly on a cluster network: gzip would
			// cost the scraper CPU for little.
			DisableCompression: true,
		}
		rt = s.own
	}
	s.client = &http.Client{Transport: rt}
	return s, nil
}

// Options returns the effective options (defaults filled in).
func (s *Scraper) Options() ScrapeOptions { return s.opts }

// targetState is where a target stands.
type targetState uint8

const (
	stateUnknown targetState = iota // no good scrape yet
	stateFresh
	stateStale
)

// target is one endpoint's scrape loop and state.
type target struct {
	s   *Scraper
	tgt Target
	url string

	cancel context.CancelFunc

	mu          sync.Mutex
	state       targetState
	loggedFirst bool // the first failure of an unknown target was logged
	removed     bool
	last        Metrics
	lastStart   time.Time
	lastErr     error
	staleTimer  *time.Timer

	scrapes, errors atomic.Uint64

	buf bytes.Buffer // owned by run
}

// SetTargets replaces the set of scraped endpoints: new ones start at once,
// removed ones stop (their series disappear), and one whose engine changed
// starts over. Duplicate or empty addresses are ignored.
func (s *Scraper) SetTargets(ts []Target) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	want := make(map[string]Target, len(ts))
	for _, t := range ts {
		if t.Addr != "" {
			if _, dup := want[t.Addr]; !dup {
				want[t.Addr] = t
			}
		}
	}
	for addr, t := range s.targets {
		if w, ok := want[addr]; !ok || w.Engine != t.tgt.Engine {
			t.stop()
			delete(s.targets, addr)
		}
	}
	for addr, w := range want {
		if _, ok := s.targets[addr]; ok {
			continue
		}
		ctx, cancel := context.WithCancel(context.Background())
		t := &target{s: s, tgt: w, url: "http://" + addr + "/metrics", cancel: cancel}
		s.targets[addr] = t
		s.wg.Add(1)
		go t.run(ctx)
	}
}

// Stop ends every scrape loop and waits for them; the scraper delivers
// nothing afterwards and SetTargets does nothing.
func (s *Scraper) Stop() {
	s.mu.Lock()
	s.stopped = true
	for addr, t := range s.targets {
		t.stop()
		delete(s.targets, addr)
	}
	s.mu.Unlock()
	s.wg.Wait()
	if s.own != nil {
		s.own.CloseIdleConnections()
	}
}

// stop ends the target's loop and timer; nothing is delivered for it after
// stop returns.
func (t *target) stop() {
	t.cancel()
	t.mu.Lock()
	t.removed = true
	if t.staleTimer != nil {
		t.staleTimer.Stop()
	}
	t.mu.Unlock()
}

// run scrapes every Interval until ctx ends.
func (t *target) run(ctx context.Context) {
	defer t.s.wg.Done()
	tick := time.NewTimer(0)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		start := time.Now()
		m, err := t.scrape(ctx)
		if ctx.Err() != nil {
			return
		}
		t.scrapes.Add(1)
		if err == nil && time.Since(start) >= t.s.opts.Staleness {
			err = fmt.Errorf("scrape %s took %s, longer than the staleness bound %s", t.url, time.Since(start).Round(time.Millisecond), t.s.opts.Staleness)
		}
		if err != nil {
			t.errors.Add(1)
			t.failed(err)
		} else {
			t.succeeded(start, m)
		}
		tick.Reset(max(0, t.s.opts.Interval-time.Since(start)))
	}
}

// scrape fetches and parses the page once.
func (t *target) scrape(ctx context.Context) (Metrics, error) {
	ctx, cancel := context.WithTimeout(ctx, t.s.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.url, nil)
	if err != nil {
		return Metrics{}, fmt.Errorf("scrape %s: %w", t.url, err)
	}
	// The text exposition format is what Parse reads; ask for it rather
	// than whatever a server negotiates by default.
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := t.s.client.Do(req)
	if err != nil {
		return Metrics{}, fmt.Errorf("scrape %s: %w", t.url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10)) // lets the connection be reused
		return Metrics{}, fmt.Errorf("scrape %s: status %d", t.url, resp.StatusCode)
	}
	t.buf.Reset()
	n, err := t.buf.ReadFrom(io.LimitReader(resp.Body, t.s.opts.MaxPageBytes+1))
	if err != nil {
		return Metrics{}, fmt.Errorf("scrape %s: read page: %w", t.url, err)
	}
	if n > t.s.opts.MaxPageBytes {
		return Metrics{}, fmt.Errorf("scrape %s: page larger than %d bytes", t.url, t.s.opts.MaxPageBytes)
	}
	m, err := Parse(t.tgt.Engine, t.buf.Bytes())
	if err != nil {
		return Metrics{}, fmt.Errorf("scrape %s: %w", t.url, err)
	}
	// Without the queue lengths the page says nothing about load, and an
	// unknown load must not look idle.
	if need := Waiting | Running; !m.Has(need) {
		return Metrics{}, fmt.Errorf("scrape %s: page lacks the %s series of engine %s", t.url, need&^m.Known, t.tgt.Engine)
	}
	return m, nil
}

// succeeded records a good scrape that started at start and delivers it.
func (t *target) succeeded(start time.Time, m Metrics) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.removed {
		return
	}
	prev := t.state
	t.state, t.last, t.lastStart, t.lastErr = stateFresh, m, start, nil
	due := t.s.opts.Staleness - time.Since(start)
	if t.staleTimer == nil {
		t.staleTimer = time.AfterFunc(due, t.checkStale)
	} else {
		t.staleTimer.Reset(due)
	}
	switch prev {
	case stateUnknown:
		t.s.opts.Log.V(2).Info("endpoint metrics available", "endpoint", t.tgt.Addr, "engine", t.tgt.Engine.String(),
			"waiting", m.Waiting, "running", m.Running, "blockSize", m.BlockSize, "numBlocks", m.NumBlocks)
	case stateStale:
		t.s.opts.Log.V(2).Info("endpoint metrics fresh again", "endpoint", t.tgt.Addr, "staleFor", time.Since(start).String())
	}
	t.s.sink.SetEndpointMetrics(t.tgt.Addr, m, false)
}

// failed records a failed scrape. Staleness itself is the timer's call:
// one failure between good scrapes does not make the data older.
func (t *target) failed(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.removed {
		return
	}
	t.lastErr = err
	if t.state == stateUnknown && !t.loggedFirst {
		t.loggedFirst = true
		t.s.opts.Log.V(2).Info("endpoint metrics unavailable; the endpoint counts as busy until a scrape succeeds",
			"endpoint", t.tgt.Addr, "error", err.Error())
	}
}

// checkStale is the staleness timer: it marks a fresh target stale unless a
// good scrape came in since the timer was armed.
func (t *target) checkStale() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.removed || t.state != stateFresh {
		return
	}
	age := time.Since(t.lastStart)
	if age < t.s.opts.Staleness {
		return // a good scrape raced the timer and re-armed it
	}
	t.state = stateStale
	reason := "no answer yet"
	if t.lastErr != nil {
		reason = t.lastErr.Error()
	}
	t.s.opts.Log.V(2).Info("endpoint metrics stale; the endpoint counts as busy and is picked last",
		"endpoint", t.tgt.Addr, "age", age.Round(time.Millisecond).String(), "bound", t.s.opts.Staleness.String(), "reason", reason)
	t.s.sink.SetEndpointMetrics(t.tgt.Addr, t.last, true)
}

// TargetStatus is one target's state, for tests and debugging.
type TargetStatus struct {
	Addr   string
	Engine Engine
	// Fresh is true while the last good scrape is within the staleness
	// bound; false before the first and once stale.
	Fresh bool
	// Metrics is the last good scrape.
	Metrics Metrics
	// Scrapes and Errors count attempts and failed attempts.
	Scrapes, Errors uint64
}

// Status returns every target's state, ordered by address.
func (s *Scraper) Status() []TargetStatus {
	s.mu.Lock()
	ts := make([]*target, 0, len(s.targets))
	for _, t := range s.targets {
		ts = append(ts, t)
	}
	s.mu.Unlock()
	out := make([]TargetStatus, 0, len(ts))
	for _, t := range ts {
		t.mu.Lock()
		out = append(out, TargetStatus{
			Addr: t.tgt.Addr, Engine: t.tgt.Engine, Fresh: t.state == stateFresh, Metrics: t.last,
			Scrapes: t.scrapes.Load(), Errors: t.errors.Load(),
		})
		t.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr < out[j].Addr })
	return out
}

var (
	staleDesc = prometheus.NewDesc("laneway_endpoint_metrics_stale",
		"1 while an endpoint has no good metrics scrape within the staleness bound (or none yet): it counts as busy and is picked last.",
		[]string{"endpoint"}, nil)
	scrapeErrorsDesc = prometheus.NewDesc("laneway_scrape_errors_total",
		"Failed scrapes of an endpoint's /metrics page (transport error, timeout, status, parse, missing queue series).",
		[]string{"endpoint"}, nil)
	scrapesDesc = prometheus.NewDesc("laneway_scrapes_total",
		"Scrapes of an endpoint's /metrics page, good or failed.", []string{"endpoint"}, nil)
	waitingDesc = prometheus.NewDesc("laneway_endpoint_engine_waiting_requests",
		"Requests waiting in the endpoint's engine at its last good scrape (all clients, not only this picker's).",
		[]string{"endpoint"}, nil)
	runningDesc = prometheus.NewDesc("laneway_endpoint_engine_running_requests",
		"Requests running in the endpoint's engine at its last good scrape.", []string{"endpoint"}, nil)
)

// Describe implements prometheus.Collector.
func (s *Scraper) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{staleDesc, scrapeErrorsDesc, scrapesDesc, waitingDesc, runningDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (s *Scraper) Collect(ch chan<- prometheus.Metric) {
	for _, st := range s.Status() {
		stale := 1.0
		if st.Fresh {
			stale = 0
		}
		ch <- prometheus.MustNewConstMetric(staleDesc, prometheus.GaugeValue, stale, st.Addr)
		ch <- prometheus.MustNewConstMetric(scrapeErrorsDesc, prometheus.CounterValue, float64(st.Errors), st.Addr)
		ch <- prometheus.MustNewConstMetric(scrapesDesc, prometheus.CounterValue, float64(st.Scrapes), st.Addr)
		if st.Metrics.Has(Waiting | Running) {
			ch <- prometheus.MustNewConstMetric(waitingDesc, prometheus.GaugeValue, float64(st.Metrics.Waiting), st.Addr)
			ch <- prometheus.MustNewConstMetric(runningDesc, prometheus.GaugeValue, float64(st.Metrics.Running), st.Addr)
		}
	}
}
