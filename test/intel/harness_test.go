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
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/laneway-dev/laneway/internal/gateway"
	"github.com/laneway-dev/laneway/internal/modelsim"
	"github.com/laneway-dev/laneway/internal/testproc"
)

// Bounds of the harness's waits: failure guards for events that should
// come much sooner, not performance assertions.
const (
	readyTimeout = 30 * time.Second
	eventTimeout = 30 * time.Second
	pollEvery    = 10 * time.Millisecond
)

// proc is a running subprocess; cleanup stops it with SIGTERM and checks a
// clean exit.
type proc struct {
	*testproc.Proc
	logs *testproc.Log
}

func startProc(t *testing.T, name, bin string, args ...string) *proc {
	t.Helper()
	tp, err := testproc.Start(testproc.Options{Name: name, Bin: bin, Args: args})
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{Proc: tp, logs: tp.Log}
	t.Cleanup(func() {
		// Not stopping within 20 s ends it with SIGQUIT, so the log shows
		// where it hung.
		if err := p.Stop(20 * time.Second); err != nil {
			t.Errorf("%s shutdown: %v", name, err)
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", name, p.logs.Tail(32<<10))
		}
	})
	return p
}

// tail is the last n bytes of a log.
func tail(s string, n int) string { return testproc.Tail(s, n) }

// freePort returns a port free on ip a moment ago.
func freePort(t *testing.T, ip string) int {
	t.Helper()
	port, err := testproc.FreePort(ip)
	if err != nil {
		t.Skipf("loopback address %s not usable here: %v", ip, err)
	}
	return port
}

// waitFor polls cond until it holds, for states that raise no event.
func waitFor(t *testing.T, what func() string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(eventTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s: %s", eventTimeout, what())
		}
		time.Sleep(pollEvery)
	}
}

var httpClient = &http.Client{Timeout: 60 * time.Second}

// sim is a cmd/modelsim process.
type sim struct {
	*proc
	addr string
}

// startSim starts a simulator on ip with extra flags and waits until its
// /health answers.
func startSim(t *testing.T, ip string, args ...string) *sim {
	t.Helper()
	addr := net.JoinHostPort(ip, strconv.Itoa(freePort(t, ip)))
	host, port, _ := net.SplitHostPort(addr)
	s := &sim{addr: addr}
	s.proc = startProc(t, "modelsim "+addr, simBinary, append([]string{"--host=" + host, "--port=" + port}, args...)...)
	if err := testproc.WaitFor(context.Background(), s.Proc, "modelsim "+addr, readyTimeout, testproc.HTTPOK("http://"+addr+"/health")); err != nil {
		t.Fatal(err)
	}
	return s
}

// records returns the simulator's finished requests, oldest first.
func (s *sim) records(t *testing.T) []modelsim.Record {
	t.Helper()
	resp, err := httpClient.Get("http://" + s.addr + "/debug/requests")
	if err != nil {
		t.Fatalf("debug records of %s: %v", s.addr, err)
	}
	defer resp.Body.Close()
	var d modelsim.DebugRequests
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
		t.Fatalf("decode debug records of %s: %v", s.addr, err)
	}
	return d.Records
}

// epp is a running picker.
type epp struct {
	*proc
	grpcAddr, healthAddr, metricsAddr string
}

// startEPP starts the picker on free 127.0.0.1 ports, plaintext, and waits
// for its readiness service.
func startEPP(t *testing.T, endpoints []string, args ...string) *epp {
	t.Helper()
	ports, err := testproc.FreePorts("127.0.0.1", 3)
	if err != nil {
		t.Fatal(err)
	}
	e := &epp{
		grpcAddr:    testproc.HostPort("127.0.0.1", ports[0]),
		healthAddr:  testproc.HostPort("127.0.0.1", ports[1]),
		metricsAddr: testproc.HostPort("127.0.0.1", ports[2]),
	}
	all := append([]string{
		"--bind-address=127.0.0.1",
		"--grpc-port=" + strconv.Itoa(ports[0]),
		"--grpc-health-port=" + strconv.Itoa(ports[1]),
		"--metrics-port=" + strconv.Itoa(ports[2]),
		"--secure-serving=false",
		"--drain-timeout=5s",
		"--endpoints=" + strings.Join(endpoints, ","),
	}, args...)
	e.proc = startProc(t, "epp", eppBinary, all...)
	if err := testproc.WaitGRPCServing(context.Background(), e.Proc, e.healthAddr, "readiness", nil, readyTimeout); err != nil {
		t.Fatalf("epp not ready: %v\n%s", err, e.logs)
	}
	return e
}

// scrape reads a /metrics page.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := httpClient.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse metrics of %s: %v", addr, err)
	}
	return fams
}

// metricSum adds the series of name whose labels include the pairs
// ("k1", "v1", ...); absent series read 0.
func metricSum(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	f, ok := fams[name]
	if !ok {
		return 0
	}
	sum := 0.0
next:
	for _, m := range f.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		sum += m.GetGauge().GetValue() + m.GetCounter().GetValue() + m.GetUntyped().GetValue()
	}
	return sum
}

func (e *epp) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	return metricSum(scrape(t, e.metricsAddr), name, labels...)
}

// waitMetric polls the picker's metrics (they raise no event) until the
// value satisfies ok.
func (e *epp) waitMetric(t *testing.T, what string, ok func(float64) bool, name string, labels ...string) float64 {
	t.Helper()
	var v float64
	waitFor(t, func() string { return fmt.Sprintf("%s: %s%v = %v", what, name, labels, v) }, func() bool {
		v = e.metric(t, name, labels...)
		return ok(v)
	})
	return v
}

// startGateway runs the local gateway in process in front of the picker
// and returns its base URL.
func startGateway(t *testing.T, e *epp) string {
	t.Helper()
	conn, err := gateway.Dial(e.grpcAddr, gateway.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	g := gateway.New(conn, gateway.Options{Timeout: 2 * time.Minute})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: g, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		g.Close()
		conn.Close()
	})
	return "http://" + ln.Addr().String()
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
	ctx, cancel := context.WithTimeout(context.Background(), eventTimeout)
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
	select {
	case a := <-ch:
		return a
	case <-time.After(eventTimeout):
		t.Fatalf("no answer within %s", eventTimeout)
		return answer{}
	}
}

// metricsProxy fronts a simulator: everything passes through, except that
// /metrics can be made to hang.
type metricsProxy struct {
	addr string
	srv  *http.Server
	rp   *httputil.ReverseProxy

	mu   sync.Mutex
	hang chan struct{} // non-nil: /metrics blocks until closed
}

func startMetricsProxy(t *testing.T, ip string, target *sim) *metricsProxy {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Skipf("loopback address %s not usable here: %v", ip, err)
	}
	u, _ := url.Parse("http://" + target.addr)
	p := &metricsProxy{addr: ln.Addr().String(), rp: httputil.NewSingleHostReverseProxy(u)}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = p.srv.Serve(ln) }()
	t.Cleanup(func() {
		p.setHang(false)
		p.srv.Close()
	})
	return p
}

func (p *metricsProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/metrics" {
		p.mu.Lock()
		hang := p.hang
		p.mu.Unlock()
		if hang != nil {
			select {
			case <-hang:
			case <-r.Context().Done():
				return
			}
		}
	}
	p.rp.ServeHTTP(w, r)
}

// setHang makes /metrics hang (on) or lets every hung request through.
func (p *metricsProxy) setHang(on bool) {
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
