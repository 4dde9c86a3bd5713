package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/laneway-dev/laneway/internal/extprocclient"
	"github.com/laneway-dev/laneway/internal/testproc"
)

// Bounds of the harness's waits. They are failure guards for events that
// should come much sooner, not performance assertions.
const (
	readyTimeout = 30 * time.Second
	eventTimeout = 20 * time.Second
	pollEvery    = 10 * time.Millisecond
	drainTimeout = 5 * time.Second
)

// eppOptions configure one picker process.
type eppOptions struct {
	// endpoints is --endpoints; empty starts a picker without endpoints.
	endpoints []string
	// policy is the --policy-config path; empty uses the synthetic default
	// class (never queues).
	policy string
	// tls keeps the default --secure-serving; otherwise plaintext.
	tls bool
	// args are further flags.
	args []string
}

// eppProc is a running picker subprocess.
type eppProc struct {
	grpcAddr, healthAddr, metricsAddr string
	tls                               bool

	proc *testproc.Proc
	logs *testproc.Log

	stopOnce sync.Once
	stopErr  error
}

// errPortTaken reports that another process bound one of the free ports
// between our probe and the picker's listen.
var errPortTaken = errors.New("port taken")

// startEPP starts the picker and waits until its readiness health service
// reports SERVING. At cleanup it stops the picker with SIGTERM and fails
// the test unless it exits 0 within the drain timeout; on failure the
// picker's log goes to the test log.
func startEPP(t *testing.T, o eppOptions) *eppProc {
	t.Helper()
	var p *eppProc
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		p, err = launchEPP(o)
		if !errors.Is(err, errPortTaken) {
			break
		}
	}
	if err != nil {
		t.Fatalf("start epp: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			// A failed test may have left the picker stuck: ask it for a
			// goroutine dump (SIGQUIT) instead of a drain, so the log shows
			// where it was.
			p.stopOnce.Do(p.proc.Quit)
			t.Logf("epp log (ended with SIGQUIT for its goroutine dump):\n%s", p.logs)
			return
		}
		if err := p.stop(); err != nil {
			t.Errorf("epp shutdown: %v", err)
			t.Logf("epp log:\n%s", p.logs)
		}
	})
	return p
}

func launchEPP(o eppOptions) (*eppProc, error) {
	ports, err := testproc.FreePorts("127.0.0.1", 3)
	if err != nil {
		return nil, err
	}
	p := &eppProc{
		grpcAddr:    testproc.HostPort("127.0.0.1", ports[0]),
		healthAddr:  testproc.HostPort("127.0.0.1", ports[1]),
		metricsAddr: testproc.HostPort("127.0.0.1", ports[2]),
		tls:         o.tls,
	}
	args := []string{
		"--bind-address=127.0.0.1",
		"--grpc-port=" + strconv.Itoa(ports[0]),
		"--grpc-health-port=" + strconv.Itoa(ports[1]),
		"--metrics-port=" + strconv.Itoa(ports[2]),
		"--endpoints=" + strings.Join(o.endpoints, ","),
		"--drain-timeout=" + drainTimeout.String(),
		"--secure-serving=" + strconv.FormatBool(o.tls),
		// The backends here are plain HTTP servers, not model servers: with
		// scraping on they would never have metrics and so stay busy (and
		// record the scrapes as requests). test/intel covers scraping
		// against the simulator.
		"--scrape-metrics=false",
	}
	if o.policy != "" {
		args = append(args, "--policy-config="+o.policy)
	}
	args = append(args, o.args...)
	p.proc, err = testproc.Start(testproc.Options{Name: "epp", Bin: eppBinary, Args: args})
	if err != nil {
		return nil, err
	}
	p.logs = p.proc.Log
	if err := testproc.WaitGRPCServing(context.Background(), p.proc, p.healthAddr, "readiness", nil, readyTimeout); err != nil {
		p.proc.Kill()
		if strings.Contains(p.logs.String(), "address already in use") {
			return nil, fmt.Errorf("%w: %v", errPortTaken, err)
		}
		return nil, fmt.Errorf("epp %v not ready: %w\nlog:\n%s", args, err, p.logs)
	}
	return p, nil
}

// signal sends SIGTERM without waiting.
func (p *eppProc) sigterm(t *testing.T) {
	t.Helper()
	if err := p.proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM epp: %v", err)
	}
}

// stop sends SIGTERM (if the process still runs) and waits for the exit;
// anything but a clean exit 0 within the drain timeout is an error. It is
// idempotent.
func (p *eppProc) stop() error {
	p.stopOnce.Do(func() { p.stopErr = p.proc.Stop(drainTimeout + 5*time.Second) })
	return p.stopErr
}

// waitExit waits for the process to exit and checks it exited 0; past
// limit it gets SIGQUIT, so the log shows what held the drain up.
func (p *eppProc) waitExit(limit time.Duration) error {
	return p.proc.Wait(limit)
}

// dial opens a gRPC connection to the picker's ext_proc port (TLS with
// verification off when the picker serves TLS, as gateways configure it for
// a self-signed picker), closed at cleanup.
func (p *eppProc) dial(t *testing.T) *grpc.ClientConn {
	t.Helper()
	creds := insecure.NewCredentials()
	if p.tls {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // self-signed test picker
	}
	conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatalf("dial epp %s: %v", p.grpcAddr, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// client returns a gateway client over a new connection.
func (p *eppProc) client(t *testing.T, o extprocclient.Options) *extprocclient.Client {
	t.Helper()
	return extprocclient.New(p.dial(t), o)
}

// scrapeClient bounds a scrape: a picker whose loop is stuck answers
// /metrics never, and the test should say so instead of hanging.
var scrapeClient = &http.Client{Timeout: 10 * time.Second}

// scrape reads the picker's /metrics.
func (p *eppProc) scrape(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := scrapeClient.Get("http://" + p.metricsAddr + "/metrics")
	if err != nil {
		t.Fatalf("scrape epp metrics: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape epp metrics: status %d", resp.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse epp metrics: %v", err)
	}
	return fams
}

// metricSum adds up the series of family name whose labels include every
// pair of labels ("k1", "v1", "k2", "v2", ...); found is false when no
// series matched.
func metricSum(fams map[string]*dto.MetricFamily, name string, labels ...string) (sum float64, found bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			matched := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					matched = true
					break
				}
			}
			if !matched {
				continue next
			}
		}
		found = true
		switch {
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Untyped != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum, found
}

// metric is metricSum of one fresh scrape; absent series read 0.
func (p *eppProc) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	v, _ := metricSum(p.scrape(t), name, labels...)
	return v
}

// waitMetric polls the metrics (the picker offers no event for them) until
// the sum equals want.
func (p *eppProc) waitMetric(t *testing.T, want float64, name string, labels ...string) {
	t.Helper()
	var got float64
	waitFor(t, func() bool {
		got = p.metric(t, name, labels...)
		return got == want
	}, func() string { return fmt.Sprintf("%s%v = %v, want %v", name, labels, got, want) })
}

// waitFor polls cond with a deadline, for states that raise no event.
func waitFor(t *testing.T, cond func() bool, what func() string) {
	t.Helper()
	deadline := time.Now().Add(eventTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s: %s", eventTimeout, what())
		}
		time.Sleep(pollEvery)
	}
}

// checkGoroutines fails the test when the test process has more goroutines
// after the test's cleanups than before it. Call it first so its cleanup
// runs last.
func checkGoroutines(t *testing.T) {
	t.Helper()
	base := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(10 * time.Second)
		for {
			n := runtime.NumGoroutine()
			if n <= base {
				return
			}
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				k := runtime.Stack(buf, true)
				t.Errorf("%d goroutines left after the test, %d before it:\n%s", n, base, buf[:k])
				return
			}
			time.Sleep(pollEvery)
		}
	})
}

// writePolicy writes a policy file into the test's temp dir.
func writePolicy(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatalf("write policy: %v", err)
	}
	return path
}

// replaceFile swaps in new content atomically (write then rename), the way
// a ConfigMap volume update lands, so the poller never reads half a file.
func replaceFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatalf("write %s: %v", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatalf("rename %s: %v", tmp, err)
	}
}

// backend is a real HTTP server on its own loopback address standing in for
// a model server. It answers with a JSON summary of what it received, or
// echoes the body when the request carries x-test-echo.
type backend struct {
	addr string
	srv  *http.Server

	mu   sync.Mutex
	seen []seenRequest
}

// seenRequest is what a backend received.
type seenRequest struct {
	path, destination string
	bodyLen           int
	bodySHA           string
}

// backendReply is a backend's JSON answer.
type backendReply struct {
	ServedBy string `json:"served_by"`
	Bytes    int    `json:"bytes"`
	SHA256   string `json:"sha256"`
}

// startBackends starts n backends on 127.0.0.2, 127.0.0.3, ... and closes
// them at cleanup.
func startBackends(t *testing.T, n int) []*backend {
	t.Helper()
	out := make([]*backend, n)
	for i := range out {
		ip := fmt.Sprintf("127.0.0.%d", i+2)
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			t.Skipf("loopback address %s not usable here: %v", ip, err)
		}
		b := &backend{addr: ln.Addr().String()}
		b.srv = &http.Server{Handler: b, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = b.srv.Serve(ln) }()
		t.Cleanup(func() { b.srv.Close() })
		out[i] = b
	}
	return out
}

func (b *backend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	sum := sha256.Sum256(body)
	b.mu.Lock()
	b.seen = append(b.seen, seenRequest{
		path: r.URL.Path, destination: r.Header.Get("x-gateway-destination-endpoint"),
		bodyLen: len(body), bodySHA: hex.EncodeToString(sum[:]),
	})
	b.mu.Unlock()
	if r.Header.Get("x-test-echo") != "" {
		w.Header().Set("content-type", "application/octet-stream")
		_, _ = w.Write(body)
		return
	}
	w.Header().Set("content-type", "application/json")
	_ = json.NewEncoder(w).Encode(backendReply{ServedBy: b.addr, Bytes: len(body), SHA256: hex.EncodeToString(sum[:])})
}

func (b *backend) requests() []seenRequest {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]seenRequest(nil), b.seen...)
}

func addrs(bs []*backend) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = b.addr
	}
	return out
}

// forward plays the gateway's upstream leg for a routed exchange: it sends
// the body the picker returned to the picked endpoint over real HTTP with
// the picker's header mutations applied, then plays the upstream response
// back through the ext_proc stream (headers, then the body in chunks of
// chunk bytes) and ends the exchange. It returns the status and the body the
// client would receive.
func forward(t *testing.T, ex *extprocclient.Exchange, path string, h http.Header, chunk int) (int, []byte) {
	t.Helper()
	d := ex.Decision()
	if !d.Routed() {
		t.Fatalf("forward: request was answered directly: %d %s", d.Immediate.Status, d.Immediate.Body)
	}
	req, err := http.NewRequest(http.MethodPost, "http://"+d.Endpoints[0]+path, bytes.NewReader(d.Body))
	if err != nil {
		t.Fatalf("forward: %v", err)
	}
	req.Header = h.Clone()
	if req.Header == nil {
		req.Header = http.Header{}
	}
	d.Mutation.Apply(req.Header)
	req.Header.Del("content-length") // net/http sets it from the body
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: eventTimeout}).Do(req)
	if err != nil {
		t.Fatalf("forward to %s: %v", d.Endpoints[0], err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("read upstream response: %v", err)
	}
	if _, err := ex.SendResponseHeaders(resp.StatusCode, resp.Header, len(body) == 0, d.Endpoints[0]); err != nil {
		t.Fatalf("response headers: %v", err)
	}
	var out []byte
	for off := 0; off < len(body); off += chunk {
		end := min(off+chunk, len(body))
		got, err := ex.SendResponseBody(body[off:end], end == len(body))
		if err != nil {
			t.Fatalf("response body at %d: %v", off, err)
		}
		out = append(out, got...)
	}
	if err := ex.Close(); err != nil {
		t.Fatalf("close exchange: %v", err)
	}
	return resp.StatusCode, out
}

// agentHints is nvext.agent_hints of a test request.
type agentHints struct {
	Priority       *int32  `json:"priority,omitempty"`
	StrictPriority *uint32 `json:"strict_priority,omitempty"`
}

type nvext struct {
	AgentHints *agentHints `json:"agent_hints,omitempty"`
}

// completionBody is an OpenAI completions body with a token-id prompt,
// which the picker counts exactly.
type completionBody struct {
	Model     string `json:"model"`
	Prompt    []int  `json:"prompt"`
	MaxTokens int    `json:"max_tokens"`
	Stream    bool   `json:"stream"`
	NVExt     *nvext `json:"nvext,omitempty"`
}

// tokens returns a body whose prompt is exactly n tokens; seed makes
// prompts distinct.
func tokens(n, seed int) []byte {
	return tokensWith(n, seed, nil)
}

func tokensWith(n, seed int, hints *agentHints) []byte {
	b := completionBody{Model: "test-model", Prompt: make([]int, n), MaxTokens: 1, Stream: true}
	for i := range b.Prompt {
		b.Prompt[i] = 1 + (seed*7919+i*31)%50000
	}
	if hints != nil {
		b.NVExt = &nvext{AgentHints: hints}
	}
	out, err := json.Marshal(b)
	if err != nil {
		panic(fmt.Sprintf("marshal test body: %v", err)) // ints only: cannot fail
	}
	return out
}

// started is the outcome of an asynchronous Start.
type started struct {
	name string
	ex   *extprocclient.Exchange
	err  error
}

// startAsync starts an exchange on its own goroutine and delivers the
// outcome on the returned channel (buffered, so the goroutine never leaks).
func startAsync(ctx context.Context, c *extprocclient.Client, name string, spec extprocclient.RequestSpec) <-chan started {
	ch := make(chan started, 1)
	go func() {
		ex, err := c.Start(ctx, spec)
		ch <- started{name: name, ex: ex, err: err}
	}()
	return ch
}

// testCtx is a context for a test's exchanges, bounded so that a picker
// that stops answering fails the test instead of hanging it.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// startInto is startAsync delivering into a shared channel, for tests
// that wait for whichever of several queued requests is released next. ch
// must have room for every request started into it.
func startInto(ctx context.Context, c *extprocclient.Client, name string, spec extprocclient.RequestSpec, ch chan<- started) {
	go func() {
		ex, err := c.Start(ctx, spec)
		ch <- started{name: name, ex: ex, err: err}
	}()
}

// await waits for an asynchronous Start's outcome.
func await(t *testing.T, ch <-chan started) started {
	t.Helper()
	select {
	case s := <-ch:
		if s.err != nil {
			t.Fatalf("request %q: %v", s.name, s.err)
		}
		return s
	case <-time.After(eventTimeout):
		t.Fatalf("no answer within %s", eventTimeout)
		return started{}
	}
}

// mustStart starts an exchange and fails the test on a transport error.
func mustStart(t *testing.T, c *extprocclient.Client, spec extprocclient.RequestSpec) *extprocclient.Exchange {
	t.Helper()
	ex, err := c.Start(testCtx(t), spec)
	if err != nil {
		t.Fatalf("start exchange: %v", err)
	}
	t.Cleanup(func() { ex.Close() })
	return ex
}

// mustRoute asserts a decision is a pick and returns the picked endpoint.
func mustRoute(t *testing.T, ex *extprocclient.Exchange) string {
	t.Helper()
	d := ex.Decision()
	if !d.Routed() {
		t.Fatalf("want a pick, got immediate response %d %s: %s", d.Immediate.Status,
			d.Immediate.Headers.Get("x-laneway-reason"), d.Immediate.Body)
	}
	if len(d.Endpoints) == 0 {
		t.Fatal("pick without endpoints")
	}
	return d.Endpoints[0]
}

// sendFirstByte plays response headers and one body chunk without ending
// the stream: the endpoint finished this request's prefill.
func sendFirstByte(t *testing.T, ex *extprocclient.Exchange) {
	t.Helper()
	if _, err := ex.SendResponseHeaders(http.StatusOK, http.Header{"content-type": {"text/event-stream"}}, false, ""); err != nil {
		t.Fatalf("response headers: %v", err)
	}
	if _, err := ex.SendResponseBody([]byte("data: {}\n\n"), false); err != nil {
		t.Fatalf("first response chunk: %v", err)
	}
}

// finishStream ends a response started by sendFirstByte and closes the
// exchange.
func finishStream(t *testing.T, ex *extprocclient.Exchange) {
	t.Helper()
	if _, err := ex.SendResponseBody([]byte("data: [DONE]\n\n"), true); err != nil {
		t.Fatalf("last response chunk: %v", err)
	}
	if err := ex.Close(); err != nil {
		t.Fatalf("close exchange: %v", err)
	}
}

// completeStream plays a whole short response and closes the exchange.
func completeStream(t *testing.T, ex *extprocclient.Exchange) {
	t.Helper()
	sendFirstByte(t, ex)
	finishStream(t, ex)
}

// immediate asserts a direct answer with the given status and reason.
func immediate(t *testing.T, ex *extprocclient.Exchange, status int, reason string) *extprocclient.ImmediateResponse {
	t.Helper()
	d := ex.Decision()
	if d.Routed() {
		t.Fatalf("want immediate %d %s, got a pick %v", status, reason, d.Endpoints)
	}
	ir := d.Immediate
	if ir.Status != status || ir.Headers.Get("x-laneway-reason") != reason {
		t.Fatalf("immediate response %d reason %q, want %d %q; body %s", ir.Status,
			ir.Headers.Get("x-laneway-reason"), status, reason, ir.Body)
	}
	return ir
}

// spec is a request with a token-id body and optional headers.
func spec(body []byte, headers ...string) extprocclient.RequestSpec {
	h := http.Header{"content-type": {"application/json"}}
	for i := 0; i+1 < len(headers); i += 2 {
		h.Set(headers[i], headers[i+1])
	}
	return extprocclient.RequestSpec{Path: "/v1/completions", Headers: h, Body: body}
}

// pinned restricts a spec to the given endpoints with a subset hint.
func pinned(s extprocclient.RequestSpec, endpoints ...string) extprocclient.RequestSpec {
	s.Subset = &extprocclient.SubsetHint{Endpoints: endpoints}
	return s
}
