package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/fixture"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

// drainTimeout is the picker's --drain-timeout here: long enough for a
// drain test's stream to finish, short enough not to slow a failing run.
const drainTimeout = 5 * time.Second

// startEPP runs the picker for the test with the suite's flags before the
// test's own: the drain timeout, and no metrics scraping (the backends here
// are plain HTTP servers, not model servers: with scraping on they would
// never have metrics and so stay busy, and record the scrapes as requests;
// test/intel covers scraping against the simulator).
func startEPP(t *testing.T, o launch.EPPOptions) *launch.EPP {
	t.Helper()
	return startEPPOf(t, bins, o)
}

// startEPPOf is startEPP with another build of the picker.
func startEPPOf(t *testing.T, b launch.Binaries, o launch.EPPOptions) *launch.EPP {
	t.Helper()
	return fixture.EPPFrom(o).DrainTimeout(drainTimeout).NoScrape().StopGrace(drainTimeout+5*time.Second).Run(t, b)
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
	resp, err := (&http.Client{Transport: tr, Timeout: launch.EventTimeout}).Do(req)
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
	s := launch.Receive(t, ch, "an asynchronous request's answer")
	if s.err != nil {
		t.Fatalf("request %q: %v", s.name, s.err)
	}
	return s
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

// releaseOneByOne completes holder's stream, takes the next request
// released into ch, requires it routed and makes it the holder, n times,
// and returns the names in release order and the last holder (still open).
// For queues behind one busy endpoint where each first byte lets exactly
// one request through.
func releaseOneByOne(t *testing.T, holder *extprocclient.Exchange, ch <-chan started, n int) ([]string, *extprocclient.Exchange) {
	t.Helper()
	var order []string
	for range n {
		completeStream(t, holder)
		next := await(t, ch)
		mustRoute(t, next.ex)
		order = append(order, next.name)
		holder = next.ex
	}
	return order, holder
}
