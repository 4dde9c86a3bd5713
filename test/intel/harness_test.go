package intel

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/internal/testbed/fixture"
	"github.com/laneway-dev/laneway/internal/testbed/gateway"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/internal/testbed/modelsim"
	"github.com/laneway-dev/laneway/internal/testbed/workload"
)

// httpClient bounds a request of the tests: a completion may wait in the
// picker's queue for a while, but never this long.
var httpClient = &http.Client{Timeout: 60 * time.Second}

// startSim runs a simulator on ip with extra flags for the test.
func startSim(t *testing.T, ip string, args ...string) *launch.Sim {
	t.Helper()
	return bins.RunSim(t, launch.SimOptions{Host: ip, Args: args})
}

// records returns the simulator's finished requests, oldest first.
func records(t *testing.T, s *launch.Sim) []modelsim.Record {
	t.Helper()
	resp, err := httpClient.Get(s.URL + "/debug/requests")
	if err != nil {
		t.Fatalf("debug records of %s: %v", s.Addr, err)
	}
	defer resp.Body.Close()
	var d modelsim.DebugRequests
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
		t.Fatalf("decode debug records of %s: %v", s.Addr, err)
	}
	return d.Records
}

// runTogether is launch.RunTogether for one picker; it fails the test on
// a workload error.
func runTogether(t *testing.T, p *launch.EPP, sims []*launch.Sim, spec workload.Spec) *workload.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := launch.RunTogether(ctx, t, p, sims, spec)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// startEPP runs the picker for the test, plaintext, with a short drain.
func startEPP(t *testing.T, endpoints []string, args ...string) *launch.EPP {
	t.Helper()
	return fixture.EPP(endpoints...).DrainTimeout(5*time.Second).Args(args...).Run(t, bins)
}

// startGateway runs the local gateway in front of the picker and returns
// its base URL.
func startGateway(t *testing.T, p *launch.EPP) string {
	t.Helper()
	return bins.RunGateway(t, launch.GatewayOptions{EPP: p, Timeout: 2 * time.Minute}).URL
}

// hints is nvext.agent_hints.
type hints struct {
	Priority       *int32  `json:"priority,omitempty"`
	StrictPriority *uint32 `json:"strict_priority,omitempty"`
}

// completion builds a /v1/completions body with a token-id prompt (counted
// exactly by picker and simulator alike).
func completion(prompt []int, maxTokens int, h *hints) []byte {
	body := map[string]any{"model": "sim-model", "prompt": prompt, "max_tokens": maxTokens}
	if h != nil {
		body["nvext"] = map[string]any{"agent_hints": h}
	}
	b, err := json.Marshal(body)
	if err != nil {
		panic(err) // ints and strings only
	}
	return b
}

// answer is a finished completion as the client saw it.
type answer struct {
	status   int
	endpoint string // the gateway's x-laneway-endpoint
	body     []byte
	err      error
}

// post sends a completion to base (a gateway or a simulator).
func post(ctx context.Context, base string, body []byte) answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("content-type", "application/json")
	resp, err := httpClient.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, endpoint: resp.Header.Get(gateway.HeaderServedBy), body: b, err: err}
}

// mustPost posts and requires a 200.
func mustPost(t *testing.T, base string, body []byte) answer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), launch.EventTimeout)
	defer cancel()
	a := post(ctx, base, body)
	if a.err != nil || a.status != http.StatusOK {
		t.Fatalf("POST %s: status %d, err %v: %s", base, a.status, a.err, a.body)
	}
	return a
}

// postAsync posts on its own goroutine; the channel is buffered.
func postAsync(ctx context.Context, base string, body []byte) <-chan answer {
	ch := make(chan answer, 1)
	go func() { ch <- post(ctx, base, body) }()
	return ch
}

func await(t *testing.T, ch <-chan answer) answer {
	t.Helper()
	return launch.Receive(t, ch, "a posted request's answer")
}

// metricsProxy fronts a simulator: everything passes through, except that
// /metrics can be made to hang, and the other requests (completions) to
// stall, as a gateway's way to the engine does on a starved node.
type metricsProxy struct {
	addr string
	srv  *http.Server
	rp   *httputil.ReverseProxy

	mu      sync.Mutex
	hang    chan struct{} // non-nil: /metrics blocks until closed
	stall   chan struct{} // non-nil: every other request blocks until closed
	stalled int           // requests that met a stall
}

func startMetricsProxy(t *testing.T, ip string, target *launch.Sim) *metricsProxy {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Skipf("loopback address %s not usable here: %v", ip, err)
	}
	u, _ := url.Parse(target.URL)
	p := &metricsProxy{addr: ln.Addr().String(), rp: httputil.NewSingleHostReverseProxy(u)}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = p.srv.Serve(ln) }()
	t.Cleanup(func() {
		p.setHang(false)
		p.setStall(false)
		p.srv.Close()
	})
	return p
}

func (p *metricsProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	gate := p.hang
	if r.URL.Path != "/metrics" {
		gate = p.stall
		if gate != nil {
			p.stalled++
		}
	}
	p.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
	}
	p.rp.ServeHTTP(w, r)
}

// setHang makes /metrics hang (on) or lets every hung request through.
func (p *metricsProxy) setHang(on bool) { p.setGate(&p.hang, on) }

// setStall makes every other request wait (on) or lets every waiting one
// through.
func (p *metricsProxy) setStall(on bool) { p.setGate(&p.stall, on) }

func (p *metricsProxy) setGate(gate *chan struct{}, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case on && *gate == nil:
		*gate = make(chan struct{})
	case !on && *gate != nil:
		close(*gate)
		*gate = nil
	}
}

// stalledRequests is how many requests met a stall so far.
func (p *metricsProxy) stalledRequests() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stalled
}

// heldWave waits until the picker's grants to px are all held on their
// way (px stalls them), at least three, and returns how many.
func heldWave(t *testing.T, p *launch.EPP, px *metricsProxy) float64 {
	t.Helper()
	var wave float64
	launch.WaitFor(t, func() string { return fmt.Sprintf("a first wave held on its way (awaiting %v)", wave) }, func() bool {
		wave = p.Metrics.Value(t, "laneway_endpoint_awaiting_engine_grants", "endpoint", px.addr)
		return wave >= 3 && float64(px.stalledRequests()) == wave
	})
	return wave
}

// noSecondWave fails t if, within d, more than wave requests reach the
// stall at px: the picker sent again while its wave was on its way.
// Something not happening has no event to await, so it watches for d.
func noSecondWave(t *testing.T, px *metricsProxy, wave float64, d time.Duration, why string) {
	t.Helper()
	from := time.Now()
	deadline := time.After(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-deadline:
			return
		case <-tick.C:
			if n := px.stalledRequests(); float64(n) > wave {
				t.Fatalf("%v in, %d requests were on their way after a first wave of %v: %s", time.Since(from).Round(time.Millisecond), n, wave, why)
			}
		}
	}
}

// stalledWay runs a simulator with simArgs behind a metricsProxy on
// proxyIP (whose stall holds the gateway's way to the engine), a picker
// with a 1536-token threshold that scrapes every 100 ms, and a
// header-only gateway; it returns once the picker has a fresh scrape.
func stalledWay(t *testing.T, simIP, proxyIP string, simArgs ...string) (*launch.Sim, *metricsProxy, *launch.EPP, string) {
	t.Helper()
	s := startSim(t, simIP, simArgs...)
	px := startMetricsProxy(t, proxyIP, s)
	p := startEPP(t, []string{px.addr}, "--policy-config="+thresholdPolicy(t, 1536), "--scrape-interval=100ms", relaxedStaleness)
	gw := bins.RunGateway(t, launch.GatewayOptions{EPP: p, Timeout: 2 * time.Minute, HeaderOnly: true}).URL
	p.Metrics.Await(t, 0, "laneway_endpoint_metrics_stale", "endpoint", px.addr)
	return s, px, p, gw
}

// stallRig is stalledWay with a one-sequence simulator, once one request
// went through and the picker holds nothing awaiting.
func stallRig(t *testing.T, simIP, proxyIP string) (*launch.Sim, *metricsProxy, *launch.EPP, string) {
	t.Helper()
	s, px, p, gw := stalledWay(t, simIP, proxyIP, "--max-num-seqs=1", "--time-per-output-token=2ms")
	mustPost(t, gw, completion(tokens(100, 1), 1, nil))
	p.Metrics.Await(t, 0, "laneway_endpoint_awaiting_engine_grants", "endpoint", px.addr)
	return s, px, p, gw
}
