package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/fixture"
	"github.com/laneway-dev/laneway/internal/testbed/gateway"
	"github.com/laneway-dev/laneway/pkg/extproc"
)

type deciderFunc func(ctx context.Context, req *extproc.Request) (extproc.Decision, error)

func (f deciderFunc) Decide(ctx context.Context, req *extproc.Request) (extproc.Decision, error) {
	return f(ctx, req)
}

// startBackend serves h on ip (a 127.0.0.x address) and returns "ip:port".
func startBackend(t *testing.T, ip string, h http.Handler) string {
	t.Helper()
	lis, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatalf("listen on %s: %v", ip, err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = lis
	srv.Start()
	t.Cleanup(srv.Close)
	return lis.Addr().String()
}

// startGateway runs a Gateway in front of the picker at eppAddr and returns
// its base URL.
func startGateway(t *testing.T, eppAddr string, useTLS bool, opts gateway.Options) string {
	t.Helper()
	url, _ := startGatewayOf(t, []string{eppAddr}, useTLS, opts)
	return url
}

// startGatewayOf runs a Gateway in front of the pickers at addrs.
func startGatewayOf(t *testing.T, addrs []string, useTLS bool, opts gateway.Options) (string, *gateway.Gateway) {
	t.Helper()
	var conns []grpc.ClientConnInterface
	for _, a := range addrs {
		conn, err := gateway.Dial(a, gateway.DialOptions{TLS: useTLS, InsecureSkipVerify: useTLS})
		if err != nil {
			t.Fatalf("Dial: %v", err)
		}
		t.Cleanup(func() { conn.Close() })
		conns = append(conns, conn)
	}
	g := gateway.New(conns, opts)
	srv := httptest.NewServer(g)
	t.Cleanup(func() {
		srv.Close()
		g.Close()
	})
	return srv.URL, g
}

// deadAddr returns a loopback address on ip that refuses connections.
func deadAddr(t *testing.T, ip string) string {
	t.Helper()
	lis, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatalf("listen on %s: %v", ip, err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

// seen is what a backend reports about the request it received.
type seen struct {
	Backend       string `json:"backend"`
	Method        string `json:"method"`
	Path          string `json:"path"`
	Body          string `json:"body"`
	ContentLength int64  `json:"content_length"`
	Destination   string `json:"destination"`
	User          string `json:"user"`
}

func reporter(name string, hits *atomic.Int32) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits != nil {
			hits.Add(1)
		}
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(seen{
			Backend: name, Method: r.Method, Path: r.URL.RequestURI(), Body: string(b), ContentLength: r.ContentLength,
			Destination: r.Header.Get(extproc.HeaderDestinationEndpoint), User: r.Header.Get("X-User"),
		})
	})
}

func TestRoutesToPick(t *testing.T) {
	a := startBackend(t, "127.0.0.2", reporter("a", nil))
	b := startBackend(t, "127.0.0.3", reporter("b", nil))
	tests := []struct {
		name     string
		method   string
		body     string
		replace  string
		wantBody string
	}{
		{name: "post", method: "POST", body: `{"prompt":"hi"}`, wantBody: `{"prompt":"hi"}`},
		{name: "replaced body", method: "POST", body: `{"priority":2}`, replace: `{"priority":-2,"extra":true}`, wantBody: `{"priority":-2,"extra":true}`},
		{name: "get", method: "GET"},
	}
	for _, useTLS := range []bool{false, true} {
		d := deciderFunc(func(_ context.Context, req *extproc.Request) (extproc.Decision, error) {
			dec := extproc.Decision{Endpoints: []string{b, a}}
			if r := req.Headers["x-replace"]; r != "" {
				dec.Body = []byte(r)
			}
			return dec, nil
		})
		url := startGateway(t, fixture.ServeExtProc(t, d, useTLS), useTLS, gateway.Options{})
		for _, tc := range tests {
			name := tc.name
			if useTLS {
				name += " over TLS"
			}
			t.Run(name, func(t *testing.T) {
				req, err := http.NewRequest(tc.method, url+"/v1/completions?x=1", strings.NewReader(tc.body))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("X-User", "u7")
				if tc.replace != "" {
					req.Header.Set("X-Replace", tc.replace)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatalf("request: %v", err)
				}
				defer resp.Body.Close()
				var got seen
				if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
					t.Fatalf("decode backend report (status %d): %v", resp.StatusCode, err)
				}
				want := seen{Backend: "b", Method: tc.method, Path: "/v1/completions?x=1", Body: tc.wantBody,
					ContentLength: int64(len(tc.wantBody)), Destination: b + "," + a, User: "u7"}
				if got != want {
					t.Errorf("backend saw %+v\nwant %+v", got, want)
				}
				if resp.StatusCode != 200 || resp.Header.Get(gateway.HeaderServedBy) != b {
					t.Errorf("status %d served by %q, want 200 from %s", resp.StatusCode, resp.Header.Get(gateway.HeaderServedBy), b)
				}
			})
		}
	}
}

func TestImmediateResponses(t *testing.T) {
	tests := []struct {
		name       string
		reply      *extproc.Reply
		wantStatus int
		wantBody   string
	}{
		{name: "429 queue limit", reply: &extproc.Reply{Status: 429, Reason: "queue_limit",
			Body: []byte(`{"error":"queue full","details":{"policy_class":"premium","limit_kind":"requests","current":4,"limit":4}}`)},
			wantStatus: 429, wantBody: `{"error":"queue full","details":{"policy_class":"premium","limit_kind":"requests","current":4,"limit":4}}`},
		{name: "503 no endpoints", reply: &extproc.Reply{Status: 503, Reason: "no_endpoints", Message: "no ready endpoint"},
			wantStatus: 503, wantBody: `{"error":"no ready endpoint"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var hits atomic.Int32
			backend := startBackend(t, "127.0.0.2", reporter("a", &hits))
			d := deciderFunc(func(context.Context, *extproc.Request) (extproc.Decision, error) {
				if tc.reply == nil {
					return extproc.Decision{Endpoints: []string{backend}}, nil
				}
				return extproc.Decision{}, tc.reply
			})
			url := startGateway(t, fixture.ServeExtProc(t, d, false), false, gateway.Options{})
			resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{}`))
			if err != nil {
				t.Fatalf("request: %v", err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.wantStatus || string(body) != tc.wantBody {
				t.Errorf("got %d %s, want %d %s", resp.StatusCode, body, tc.wantStatus, tc.wantBody)
			}
			if resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get(extproc.HeaderReason) != tc.reply.Reason {
				t.Errorf("headers %v", resp.Header)
			}
			if n := hits.Load(); n != 0 {
				t.Errorf("backend hit %d times for an immediate response", n)
			}
		})
	}
}

// events records a request's lifecycle.
type events struct {
	mu   sync.Mutex
	list []string
	done chan struct{}
}

func (e *events) FirstByte() { e.mu.Lock(); e.list = append(e.list, "first_byte"); e.mu.Unlock() }
func (e *events) Done() {
	e.mu.Lock()
	e.list = append(e.list, "done")
	e.mu.Unlock()
	close(e.done)
}

// TestStreamingResponse: the backend cannot produce its last event until the
// client has received the first, so the test only passes if every hop
// (backend -> gateway -> picker echo -> gateway -> client) forwards chunk by
// chunk without buffering.
func TestStreamingResponse(t *testing.T) {
	clientSawFirst := make(chan struct{})
	backend := startBackend(t, "127.0.0.2", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-clientSawFirst:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, "data: last\n\ndata: [DONE]\n\n")
	}))
	lc := &events{done: make(chan struct{})}
	d := deciderFunc(func(context.Context, *extproc.Request) (extproc.Decision, error) {
		return extproc.Decision{Endpoints: []string{backend}, Lifecycle: lc}, nil
	})
	url := startGateway(t, fixture.ServeExtProc(t, d, false), false, gateway.Options{})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions", strings.NewReader(`{"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get(gateway.HeaderServedBy) != backend {
		t.Errorf("headers %v", resp.Header)
	}
	br := bufio.NewReader(resp.Body)
	var events []string
	for {
		line, err := br.ReadString('\n')
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("read stream (a buffering hop deadlocks here until the timeout): %v", err)
		}
		if strings.HasPrefix(line, "data: ") {
			events = append(events, strings.TrimSpace(strings.TrimPrefix(line, "data: ")))
			if len(events) == 1 {
				close(clientSawFirst)
			}
		}
	}
	if want := []string{"first", "last", "[DONE]"}; !slices.Equal(events, want) {
		t.Errorf("events %v, want %v", events, want)
	}
	select {
	case <-lc.done:
	case <-ctx.Done():
		t.Fatal("Lifecycle.Done not called")
	}
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if want := []string{"first_byte", "done"}; !slices.Equal(lc.list, want) {
		t.Errorf("lifecycle %v, want %v", lc.list, want)
	}
}

// TestHeadersBeforeBody: the response headers reach the client as soon as
// the backend sends them, before any body byte, as Envoy forwards them: a
// streaming client sees its request accepted while it still waits for its
// first token (the backend sends nothing more until the client has the
// headers).
func TestHeadersBeforeBody(t *testing.T) {
	clientSawHeaders := make(chan struct{})
	backend := startBackend(t, "127.0.0.2", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select {
		case <-clientSawHeaders:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	d := deciderFunc(func(context.Context, *extproc.Request) (extproc.Decision, error) {
		return extproc.Decision{Endpoints: []string{backend}}, nil
	})
	url := startGateway(t, fixture.ServeExtProc(t, d, false), false, gateway.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions", strings.NewReader(`{"stream":true}`))
	resp, err := http.DefaultClient.Do(req) // a gateway holding the headers back deadlocks here until the timeout
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	defer resp.Body.Close()
	close(clientSawHeaders)
	if b, err := io.ReadAll(resp.Body); err != nil || string(b) != "data: [DONE]\n\n" {
		t.Fatalf("body %q, %v", b, err)
	}
}

func TestFallbackOnConnectFailure(t *testing.T) {
	live := startBackend(t, "127.0.0.3", reporter("live", nil))
	dead1, dead2 := deadAddr(t, "127.0.0.2"), deadAddr(t, "127.0.0.4")
	tests := []struct {
		name       string
		endpoints  []string
		wantStatus int
		wantServed string
	}{
		{name: "second endpoint serves", endpoints: []string{dead1, live}, wantStatus: 200, wantServed: live},
		{name: "third endpoint serves", endpoints: []string{dead1, dead2, live}, wantStatus: 200, wantServed: live},
		{name: "all unreachable", endpoints: []string{dead1, dead2}, wantStatus: 503},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := deciderFunc(func(context.Context, *extproc.Request) (extproc.Decision, error) {
				return extproc.Decision{Endpoints: tc.endpoints}, nil
			})
			url := startGateway(t, fixture.ServeExtProc(t, d, false), false, gateway.Options{})
			resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"p":1}`))
			if err != nil {
				t.Fatalf("request: %v", err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.wantStatus || resp.Header.Get(gateway.HeaderServedBy) != tc.wantServed {
				t.Errorf("got %d served by %q (%s), want %d from %q", resp.StatusCode, resp.Header.Get(gateway.HeaderServedBy), body, tc.wantStatus, tc.wantServed)
			}
			if tc.wantStatus == 200 && !strings.Contains(string(body), `"body":"{\"p\":1}"`) {
				t.Errorf("fallback endpoint did not get the body: %s", body)
			}
		})
	}
}

// TestClientGoneWhileQueued: a client that hangs up while its request waits
// in the picker cancels the ext_proc stream, which ends the Decider's wait.
func TestClientGoneWhileQueued(t *testing.T) {
	entered := make(chan struct{})
	ended := make(chan error, 1)
	d := deciderFunc(func(ctx context.Context, _ *extproc.Request) (extproc.Decision, error) {
		close(entered)
		<-ctx.Done()
		ended <- ctx.Err()
		return extproc.Decision{}, ctx.Err()
	})
	url := startGateway(t, fixture.ServeExtProc(t, d, false), false, gateway.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", url+"/", strings.NewReader("{}"))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-entered
	cancel()
	if err := <-ended; !errors.Is(err, context.Canceled) {
		t.Errorf("decider ctx ended with %v, want context.Canceled", err)
	}
	if err := <-errc; err == nil {
		t.Error("client request succeeded after cancel")
	}
}

func TestTimeoutAndPickerDown(t *testing.T) {
	blocking := deciderFunc(func(ctx context.Context, _ *extproc.Request) (extproc.Decision, error) {
		<-ctx.Done()
		return extproc.Decision{}, ctx.Err()
	})
	tests := []struct {
		name       string
		epp        func(t *testing.T) string
		opts       gateway.Options
		wantStatus int
		wantReason string
	}{
		{name: "queued past the timeout", epp: func(t *testing.T) string { return fixture.ServeExtProc(t, blocking, false) },
			opts: gateway.Options{Timeout: 50 * time.Millisecond}, wantStatus: 504, wantReason: "timeout"},
		{name: "picker unreachable", epp: func(t *testing.T) string { return deadAddr(t, "127.0.0.1") },
			wantStatus: 500, wantReason: "ext_proc_error"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			url := startGateway(t, tc.epp(t), false, tc.opts)
			resp, err := http.Post(url+"/", "application/json", strings.NewReader("{}"))
			if err != nil {
				t.Fatalf("request: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.wantStatus || resp.Header.Get(extproc.HeaderReason) != tc.wantReason {
				t.Errorf("got %d %q, want %d %q", resp.StatusCode, resp.Header.Get(extproc.HeaderReason), tc.wantStatus, tc.wantReason)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		mod     func(c *gateway.Config)
		wantErr string
	}{
		{name: "defaults", mod: func(*gateway.Config) {}},
		{name: "bad listen", mod: func(c *gateway.Config) { c.Listen = "8080" }, wantErr: "--listen"},
		{name: "bad epp", mod: func(c *gateway.Config) { c.EPP = "epp" }, wantErr: "--epp"},
		{name: "negative timeout", mod: func(c *gateway.Config) { c.Gateway.Timeout = -1 }, wantErr: "--timeout"},
		{name: "zero body limit", mod: func(c *gateway.Config) { c.Gateway.MaxBodyBytes = 0 }, wantErr: "--max-body-bytes"},
		{name: "skip verify without TLS", mod: func(c *gateway.Config) { c.Dial.TLS = false; c.Dial.InsecureSkipVerify = true }, wantErr: "--epp-tls"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := gateway.NewConfig()
			tc.mod(c)
			err := c.Validate()
			if (tc.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("Validate() = %v, want error containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestSeveralPickers: requests go to the pickers in turn; one that is
// down is replaced by the next for the requests it would have decided;
// and a picker that dies after deciding leaves its response to be
// finished without it. Every request is answered once.
func TestSeveralPickers(t *testing.T) {
	a := startBackend(t, "127.0.0.2", reporter("a", nil))
	counting := func(n *atomic.Int32) extproc.Decider {
		return deciderFunc(func(context.Context, *extproc.Request) (extproc.Decision, error) {
			n.Add(1)
			return extproc.Decision{Endpoints: []string{a}}, nil
		})
	}
	post := func(t *testing.T, url string) {
		t.Helper()
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var got seen
		if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != 200 || got.Backend != "a" {
			t.Fatalf("answer %d %+v %v, want 200 from a", resp.StatusCode, got, err)
		}
	}

	t.Run("in turn", func(t *testing.T) {
		var n1, n2 atomic.Int32
		url, _ := startGatewayOf(t, []string{fixture.ServeExtProc(t, counting(&n1), false), fixture.ServeExtProc(t, counting(&n2), false)}, false, gateway.Options{})
		for range 10 {
			post(t, url)
		}
		if n1.Load() != 5 || n2.Load() != 5 {
			t.Errorf("decisions %d and %d, want 5 each", n1.Load(), n2.Load())
		}
	})

	t.Run("one down", func(t *testing.T) {
		var n atomic.Int32
		url, g := startGatewayOf(t, []string{deadAddr(t, "127.0.0.1"), fixture.ServeExtProc(t, counting(&n), false)}, false, gateway.Options{})
		for range 6 {
			post(t, url)
		}
		if retried, _ := g.FailoverStats(); n.Load() != 6 || retried != 3 {
			t.Errorf("the live picker decided %d, %d retried; want 6 and 3", n.Load(), retried)
		}
	})

	t.Run("dies after deciding", func(t *testing.T) {
		// The picker decides for a backend that answers only once the
		// picker is gone.
		gs := grpc.NewServer()
		b := startBackend(t, "127.0.0.3", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			gs.Stop()
			reporter("a", nil).ServeHTTP(w, r)
		}))
		extproc.NewServer(deciderFunc(func(context.Context, *extproc.Request) (extproc.Decision, error) {
			return extproc.Decision{Endpoints: []string{b}}, nil
		}), extproc.Options{}).Register(gs)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = gs.Serve(lis) }()
		t.Cleanup(gs.Stop)
		url, g := startGatewayOf(t, []string{lis.Addr().String(), deadAddr(t, "127.0.0.1")}, false, gateway.Options{Logger: testLogger(t)})
		post(t, url)
		if _, unpicked := g.FailoverStats(); unpicked != 1 {
			t.Errorf("responses finished without their picker: %d, want 1", unpicked)
		}
	})
}

func testLogger(t *testing.T) logr.Logger {
	return funcr.New(func(prefix, args string) { t.Log(prefix, args) }, funcr.Options{Verbosity: 4})
}

// TestHeaderOnlyGateway: with a header-only shape the picker's stream is
// over (Lifecycle.Done, no first byte) before the request reaches the
// model server, and the response streams to the client without the
// picker, chunk by chunk.
func TestHeaderOnlyGateway(t *testing.T) {
	tests := []struct {
		name   string
		shape  extprocclient.Shape
		perReq bool
	}{
		{name: "envoy skip", shape: extprocclient.EnvoySkip},
		{name: "nginx shim", shape: extprocclient.NginxShim, perReq: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lc := &events{done: make(chan struct{})}
			clientSawFirst := make(chan struct{})
			doneFirst := make(chan bool, 1)
			backend := startBackend(t, "127.0.0.2", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				select {
				case <-lc.done:
					doneFirst <- true
				default:
					doneFirst <- false
				}
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, "data: first\n\n")
				w.(http.Flusher).Flush()
				select {
				case <-clientSawFirst:
				case <-r.Context().Done():
					return
				}
				_, _ = io.WriteString(w, "data: [DONE]\n\n")
			}))
			d := deciderFunc(func(context.Context, *extproc.Request) (extproc.Decision, error) {
				return extproc.Decision{Endpoints: []string{backend}, Lifecycle: lc}, nil
			})
			eppAddr := fixture.ServeExtProc(t, d, true)
			opts := gateway.Options{Shape: tc.shape}
			var g *gateway.Gateway
			if tc.perReq {
				g = gateway.NewPerRequest(func() (*grpc.ClientConn, error) {
					return gateway.Dial(eppAddr, gateway.DialOptions{TLS: true, InsecureSkipVerify: true})
				}, opts)
			} else {
				conn, err := gateway.Dial(eppAddr, gateway.DialOptions{TLS: true, InsecureSkipVerify: true})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { conn.Close() })
				g = gateway.New([]grpc.ClientConnInterface{conn}, opts)
			}
			srv := httptest.NewServer(g)
			t.Cleanup(func() { srv.Close(); g.Close() })

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/completions", strings.NewReader(`{"stream":true}`))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("request: %v", err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Header.Get(gateway.HeaderServedBy) != backend {
				t.Errorf("status %d, headers %v", resp.StatusCode, resp.Header)
			}
			br := bufio.NewReader(resp.Body)
			var got []string
			for {
				line, err := br.ReadString('\n')
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatalf("read stream (a buffering hop deadlocks here until the timeout): %v", err)
				}
				if strings.HasPrefix(line, "data: ") {
					got = append(got, strings.TrimSpace(strings.TrimPrefix(line, "data: ")))
					if len(got) == 1 {
						close(clientSawFirst)
					}
				}
			}
			if want := []string{"first", "[DONE]"}; !slices.Equal(got, want) {
				t.Errorf("events %v, want %v", got, want)
			}
			if !<-doneFirst {
				t.Error("the picker's stream was still open when the request reached the model server")
			}
			lc.mu.Lock()
			defer lc.mu.Unlock()
			if want := []string{"done"}; !slices.Equal(lc.list, want) {
				t.Errorf("lifecycle %v, want %v", lc.list, want)
			}
		})
	}
}

// TestShapeFlags: the response-phase and connection flags choose the
// gateway played.
func TestShapeFlags(t *testing.T) {
	tests := []struct {
		args []string
		want extprocclient.Shape
	}{
		{nil, extprocclient.Envoy},
		{[]string{"--epp-conn-per-request"}, extprocclient.Envoy},
		{[]string{"--response-phases=false"}, extprocclient.EnvoySkip},
		{[]string{"--response-phases=false", "--epp-conn-per-request"}, extprocclient.NginxShim},
	}
	for _, tc := range tests {
		c := gateway.NewConfig()
		fs := pflag.NewFlagSet("gateway", pflag.ContinueOnError)
		c.AddFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if got := c.Shape(); got != tc.want {
			t.Errorf("%v: shape %s, want %s", tc.args, got, tc.want)
		}
	}
}
