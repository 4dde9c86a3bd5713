package podmetrics

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

// eventTimeout guards waits for events that should come within a few
// scrape intervals; it is a failure bound, not a performance assertion.
const eventTimeout = 10 * time.Second

// relaxed is the staleness bound of tests about something else: no good
// scrape takes that long even on a loaded machine, so nothing flaps stale.
const relaxed = 5 * time.Second

// delivery is one Sink call.
type delivery struct {
	addr  string
	m     Metrics
	stale bool
	at    time.Time
}

// chanSink records deliveries on a channel.
type chanSink chan delivery

func (c chanSink) SetEndpointMetrics(addr string, m Metrics, stale bool) {
	c <- delivery{addr: addr, m: m, stale: stale, at: time.Now()}
}

// next waits for the next delivery.
func (c chanSink) next(t *testing.T) delivery {
	t.Helper()
	select {
	case d := <-c:
		return d
	case <-time.After(eventTimeout):
		t.Fatalf("no delivery within %s", eventTimeout)
		return delivery{}
	}
}

// nextWhere skips deliveries until one matches.
func (c chanSink) nextWhere(t *testing.T, what string, ok func(delivery) bool) delivery {
	t.Helper()
	deadline := time.After(eventTimeout)
	for {
		select {
		case d := <-c:
			if ok(d) {
				return d
			}
		case <-deadline:
			t.Fatalf("no delivery %s within %s", what, eventTimeout)
			return delivery{}
		}
	}
}

// pageServer is a real HTTP server on a loopback address whose /metrics
// page and behaviour the test controls.
type pageServer struct {
	addr string
	srv  *http.Server

	mu      sync.Mutex
	page    string
	status  int
	hang    chan struct{} // non-nil: requests block until it is closed
	started chan struct{} // receives a value when a request begins to hang
}

func newPageServer(t *testing.T, ip, page string) *pageServer {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Skipf("loopback address %s not usable: %v", ip, err)
	}
	p := &pageServer{addr: ln.Addr().String(), page: page, status: http.StatusOK, started: make(chan struct{}, 16)}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = p.srv.Serve(ln) }()
	t.Cleanup(func() {
		p.setHang(false)
		p.srv.Close()
	})
	return p
}

func (p *pageServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	page, status, hang := p.page, p.status, p.hang
	p.mu.Unlock()
	if r.URL.Path != "/metrics" {
		http.NotFound(w, r)
		return
	}
	if hang != nil {
		select {
		case p.started <- struct{}{}:
		default:
		}
		select {
		case <-hang:
		case <-r.Context().Done():
			return
		}
	}
	w.WriteHeader(status)
	_, _ = w.Write([]byte(page))
}

func (p *pageServer) set(page string, status int) {
	p.mu.Lock()
	p.page, p.status = page, status
	p.mu.Unlock()
}

// setHang makes later requests block (on) or releases every blocked one.
func (p *pageServer) setHang(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case on && p.hang == nil:
		p.hang = make(chan struct{})
	case !on && p.hang != nil:
		close(p.hang)
		p.hang = nil
	}
}

func vllmPage(waiting, running int) string {
	return fmt.Sprintf(`# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} %d
vllm:num_requests_running{model_name="m"} %d
vllm:kv_cache_usage_perc{model_name="m"} 0.25
vllm:cache_config_info{block_size="16",num_gpu_blocks="1000"} 1
`, waiting, running)
}

func newTestScraper(t *testing.T, sink Sink, o ScrapeOptions) *Scraper {
	t.Helper()
	s, err := NewScraper(sink, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

func TestScrapeDeliversParsedPage(t *testing.T) {
	ps := newPageServer(t, "127.0.0.31", vllmPage(3, 2))
	sink := make(chanSink, 64)
	s := newTestScraper(t, sink, ScrapeOptions{Interval: 20 * time.Millisecond, Staleness: relaxed})
	s.SetTargets([]Target{{Addr: ps.addr, Engine: EngineVLLM}})

	d := sink.next(t)
	want := Metrics{Known: Waiting | Running | KVCacheUsage | BlockSize | NumBlocks, Waiting: 3, Running: 2, KVCacheUsage: 0.25, BlockSize: 16, NumBlocks: 1000}
	if d.addr != ps.addr || d.stale || d.m.Known != want.Known || d.m.Waiting != 3 || d.m.Running != 2 || d.m.BlockSize != 16 || d.m.NumBlocks != 1000 {
		t.Fatalf("delivery = %+v, want fresh %+v for %s", d, want, ps.addr)
	}
	// The page changes; a later scrape carries it.
	ps.set(vllmPage(7, 4), http.StatusOK)
	d = sink.nextWhere(t, "with waiting 7", func(d delivery) bool { return d.m.Waiting == 7 })
	if d.m.Running != 4 || d.stale {
		t.Fatalf("delivery = %+v, want fresh running 4", d)
	}
	st := s.Status()
	if len(st) != 1 || !st[0].Fresh || st[0].Scrapes < 2 || st[0].Errors != 0 {
		t.Fatalf("status = %+v, want one fresh target, >= 2 scrapes, no errors", st)
	}
}

// TestScrapeHangGoesStaleThenRecovers: a page that stops answering makes
// the endpoint stale by the timer, while the hung request is still open,
// and a good scrape makes it fresh again.
func TestScrapeHangGoesStaleThenRecovers(t *testing.T) {
	ps := newPageServer(t, "127.0.0.32", vllmPage(0, 1))
	sink := make(chanSink, 256)
	interval := 50 * time.Millisecond
	s := newTestScraper(t, sink, ScrapeOptions{Interval: interval, Timeout: 10 * time.Second})
	s.SetTargets([]Target{{Addr: ps.addr, Engine: EngineVLLM}})
	sink.next(t)

	ps.setHang(true)
	// The next scrape hangs (timeout 10 s): only the timer can report it.
	select {
	case <-ps.started:
	case <-time.After(eventTimeout):
		t.Fatal("no scrape reached the hung page")
	}
	stale := sink.nextWhere(t, "marked stale", func(d delivery) bool { return d.stale })
	if stale.m.Running != 1 {
		t.Errorf("stale delivery carries %+v, want the last good scrape (running 1)", stale.m)
	}
	if st := s.Status(); st[0].Fresh {
		t.Errorf("status %+v after the stale delivery, want not fresh", st[0])
	}

	ps.setHang(false)
	fresh := sink.nextWhere(t, "fresh again", func(d delivery) bool { return !d.stale })
	if fresh.m.Running != 1 {
		t.Errorf("recovered delivery %+v", fresh.m)
	}
}

// TestScrapeStaleDeadline checks the timer's arithmetic: the stale report
// comes one staleness bound after the start of the last good scrape, not a
// timeout later. The bound is generous against scheduling delays (it is
// the meaning of the option, not a speed).
func TestScrapeStaleDeadline(t *testing.T) {
	ps := newPageServer(t, "127.0.0.33", vllmPage(0, 0))
	sink := make(chanSink, 256)
	staleness := 300 * time.Millisecond
	s := newTestScraper(t, sink, ScrapeOptions{Interval: 100 * time.Millisecond, Staleness: staleness, Timeout: time.Minute})
	s.SetTargets([]Target{{Addr: ps.addr, Engine: EngineVLLM}})
	sink.next(t)
	ps.setHang(true)
	hungAt := time.Now()
	stale := sink.nextWhere(t, "marked stale", func(d delivery) bool { return d.stale })
	if late := stale.at.Sub(hungAt); late > staleness+time.Second {
		t.Errorf("stale reported %s after the page hung; the bound is %s (timeout 1m must not matter)", late, staleness)
	}
}

func TestScrapeFailuresNeverLookFresh(t *testing.T) {
	cases := []struct {
		name   string
		page   string
		status int
		engine Engine
	}{
		{"status 500", vllmPage(0, 0), http.StatusInternalServerError, EngineVLLM},
		{"not a metrics page", `{"served_by":"x"}`, http.StatusOK, EngineVLLM},
		{"other engine's names", vllmPage(0, 0), http.StatusOK, EngineSGLang},
		{"malformed series", "vllm:num_requests_waiting{model_name=\"m\" 1\n", http.StatusOK, EngineVLLM},
		{"queue series missing", "vllm:kv_cache_usage_perc 0.5\n", http.StatusOK, EngineVLLM},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ps := newPageServer(t, fmt.Sprintf("127.0.0.%d", 40+i), tc.page)
			ps.set(tc.page, tc.status)
			var logMu sync.Mutex
			var logs []string
			log := funcr.New(func(prefix, args string) {
				logMu.Lock()
				logs = append(logs, args)
				logMu.Unlock()
			}, funcr.Options{Verbosity: 2})
			sink := make(chanSink, 64)
			s := newTestScraper(t, sink, ScrapeOptions{Interval: 10 * time.Millisecond, Log: log})
			s.SetTargets([]Target{{Addr: ps.addr, Engine: tc.engine}})
			var st []TargetStatus
			launch.WaitFor(t, func() string { return fmt.Sprintf("status %+v: want 3 errors", st) }, func() bool {
				st = s.Status()
				return len(st) == 1 && st[0].Errors >= 3
			})
			if st[0].Fresh {
				t.Fatalf("status %+v: fresh after failures only", st[0])
			}
			select {
			case d := <-sink:
				t.Fatalf("delivery %+v from a target that never scraped well", d)
			default:
			}
			logMu.Lock()
			defer logMu.Unlock()
			if n := countContaining(logs, "endpoint metrics unavailable"); n != 1 {
				t.Errorf("logged 'unavailable' %d times, want once: %q", n, logs)
			}
		})
	}
}

func countContaining(lines []string, s string) int {
	n := 0
	for _, l := range lines {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}

func TestScrapeTransitionsLoggedOnce(t *testing.T) {
	ps := newPageServer(t, "127.0.0.34", vllmPage(0, 0))
	var logMu sync.Mutex
	var logs []string
	log := funcr.New(func(_, args string) {
		logMu.Lock()
		logs = append(logs, args)
		logMu.Unlock()
	}, funcr.Options{Verbosity: 2})
	sink := make(chanSink, 1024)
	s := newTestScraper(t, sink, ScrapeOptions{Interval: 10 * time.Millisecond, Staleness: 300 * time.Millisecond, Log: log})
	s.SetTargets([]Target{{Addr: ps.addr, Engine: EngineVLLM}})
	sink.next(t)
	ps.set("", http.StatusServiceUnavailable) // fails fast, many times
	sink.nextWhere(t, "stale", func(d delivery) bool { return d.stale })
	// Several more failures while stale must not log again. The scraper
	// raises no event per failure: poll its status, with a deadline.
	base := s.Status()[0].Errors
	var st []TargetStatus
	launch.WaitFor(t, func() string { return fmt.Sprintf("status %+v: want %d errors", st, base+5) }, func() bool {
		st = s.Status()
		return st[0].Errors >= base+5
	})
	ps.set(vllmPage(0, 0), http.StatusOK)
	sink.nextWhere(t, "fresh", func(d delivery) bool { return !d.stale })
	logMu.Lock()
	defer logMu.Unlock()
	for _, c := range []struct {
		msg  string
		want int
	}{{"endpoint metrics available", 1}, {"endpoint metrics stale", 1}, {"endpoint metrics fresh again", 1}} {
		if n := countContaining(logs, c.msg); n != c.want {
			t.Errorf("%q logged %d times, want %d:\n%s", c.msg, n, c.want, strings.Join(logs, "\n"))
		}
	}
}

func TestSetTargetsStopsAndRestarts(t *testing.T) {
	a := newPageServer(t, "127.0.0.35", vllmPage(1, 0))
	b := newPageServer(t, "127.0.0.36", "sglang:num_queue_reqs 2\nsglang:num_running_reqs 5\n")
	sink := make(chanSink, 1024)
	s := newTestScraper(t, sink, ScrapeOptions{Interval: 10 * time.Millisecond, Staleness: relaxed})
	s.SetTargets([]Target{{Addr: a.addr}, {Addr: a.addr}, {Addr: ""}})
	if st := s.Status(); len(st) != 1 {
		t.Fatalf("status %+v: want one target (duplicates and empty ignored)", st)
	}
	sink.nextWhere(t, "from a", func(d delivery) bool { return d.addr == a.addr })
	s.SetTargets([]Target{{Addr: b.addr, Engine: EngineSGLang}})
	d := sink.nextWhere(t, "from b", func(d delivery) bool { return d.addr == b.addr })
	if d.m.Waiting != 2 || d.m.Running != 5 {
		t.Errorf("b delivered %+v, want SGLang's waiting 2 running 5", d.m)
	}
	// a stopped inside SetTargets, before b started: every delivery of a
	// precedes b's first, so none may follow it.
	for range 3 {
		if d := sink.next(t); d.addr != b.addr {
			t.Fatalf("delivery for removed target %s", d.addr)
		}
	}
	if st := s.Status(); len(st) != 1 || st[0].Addr != b.addr || st[0].Engine != EngineSGLang {
		t.Fatalf("status %+v, want only b as sglang", st)
	}
	s.Stop()
	s.SetTargets([]Target{{Addr: a.addr}})
	if st := s.Status(); len(st) != 0 {
		t.Fatalf("status after Stop %+v, want none", st)
	}
}

func TestScrapeOptionsValidate(t *testing.T) {
	cases := []struct {
		name string
		o    ScrapeOptions
		ok   bool
	}{
		{"defaults", ScrapeOptions{}, true},
		{"staleness equal to interval", ScrapeOptions{Interval: time.Second, Staleness: time.Second}, true},
		{"staleness below interval", ScrapeOptions{Interval: time.Second, Staleness: 500 * time.Millisecond}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.o.Validate()
			if (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok %v", err, tc.ok)
			}
		})
	}
	got := ScrapeOptions{Interval: 50 * time.Millisecond}.withDefaults()
	if got.Staleness != 100*time.Millisecond || got.Timeout != 100*time.Millisecond || got.MaxPageBytes != defaultMaxPageBytes {
		t.Errorf("defaults of a 50ms interval = %+v, want staleness and timeout 100ms", got)
	}
	if _, err := NewScraper(nil, ScrapeOptions{}); err == nil {
		t.Error("NewScraper without a sink succeeded")
	}
}

func TestScraperCollector(t *testing.T) {
	ps := newPageServer(t, "127.0.0.37", vllmPage(4, 2))
	sink := make(chanSink, 1024)
	s := newTestScraper(t, sink, ScrapeOptions{Interval: 10 * time.Millisecond, Staleness: relaxed})
	s.SetTargets([]Target{{Addr: ps.addr}, {Addr: "127.0.0.38:1"}})
	sink.next(t)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s)
	want := fmt.Sprintf(`# HELP laneway_endpoint_engine_waiting_requests Requests waiting in the endpoint's engine at its last good scrape (all clients, not only this picker's).
# TYPE laneway_endpoint_engine_waiting_requests gauge
laneway_endpoint_engine_waiting_requests{endpoint=%[1]q} 4
# HELP laneway_endpoint_metrics_stale 1 while an endpoint has no good metrics scrape within the staleness bound (or none yet): it counts as busy and is picked last.
# TYPE laneway_endpoint_metrics_stale gauge
laneway_endpoint_metrics_stale{endpoint=%[1]q} 0
laneway_endpoint_metrics_stale{endpoint="127.0.0.38:1"} 1
`, ps.addr)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "laneway_endpoint_engine_waiting_requests", "laneway_endpoint_metrics_stale"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(s, "laneway_scrape_errors_total"); n != 2 {
		t.Errorf("laneway_scrape_errors_total has %d series, want 2", n)
	}
}
