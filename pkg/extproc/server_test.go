package extproc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/pkg/extproc"
)

// pattern returns n bytes that differ from chunk to chunk, so misordered or
// duplicated chunks cannot go unnoticed.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/1000)
	}
	return b
}

func TestRouting(t *testing.T) {
	big := pattern(200_000)
	tests := []struct {
		name       string
		mode       extprocclient.Mode
		method     string
		body       []byte
		replace    []byte
		endpoints  []string
		wantBody   []byte
		wantLength string // content-length mutation, "" = none
	}{
		{name: "full duplex without body", method: "GET", endpoints: []string{"10.0.0.1:8000"}},
		{name: "full duplex small body", body: []byte(`{"model":"m","prompt":"hi"}`), endpoints: []string{"10.0.0.1:8000"}, wantBody: []byte(`{"model":"m","prompt":"hi"}`)},
		{name: "full duplex 200kB body with fallbacks", body: big, endpoints: []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8001"}, wantBody: big},
		{name: "full duplex replaced body", body: []byte(`{"priority":3}`), replace: []byte(`{"priority":-3,"x":1}`), endpoints: []string{"10.0.0.1:8000"}, wantBody: []byte(`{"priority":-3,"x":1}`), wantLength: "21"},
		{name: "buffered small body", mode: extprocclient.Buffered, body: []byte(`{"a":1}`), endpoints: []string{"10.0.0.4:8000"}, wantBody: []byte(`{"a":1}`)},
		{name: "buffered replaced body", mode: extprocclient.Buffered, body: []byte(`{"a":1}`), replace: []byte(`{"a":12345}`), endpoints: []string{"10.0.0.4:8000"}, wantBody: []byte(`{"a":12345}`), wantLength: "11"},
		{name: "buffered without body", mode: extprocclient.Buffered, method: "GET", endpoints: []string{"10.0.0.5:9000"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var seen []byte
			d := deciderFunc(func(_ context.Context, req *extproc.Request) (extproc.Decision, error) {
				seen = append([]byte(nil), req.Body...)
				if req.Headers[":path"] != "/v1/completions" || req.Headers["x-user"] != "u1" {
					return extproc.Decision{}, fmt.Errorf("headers not passed through: %v", req.Headers)
				}
				return extproc.Decision{Endpoints: tc.endpoints, Body: tc.replace}, nil
			})
			conn := startServer(t, d, extproc.Options{})
			c := extprocclient.New(conn, extprocclient.Options{Mode: tc.mode, ChunkBytes: 16 << 10})
			ex, err := c.Start(context.Background(), extprocclient.RequestSpec{
				Method: tc.method, Path: "/v1/completions", Body: tc.body,
				Headers: http.Header{"X-User": {"u1"}, "X-Gateway-Destination-Endpoint": {"6.6.6.6:1"}},
			})
			if err != nil {
				t.Fatalf("Start: %v", err)
			}
			defer ex.Close()
			dec := ex.Decision()
			if !dec.Routed() {
				t.Fatalf("immediate response %d %s", dec.Immediate.Status, dec.Immediate.Body)
			}
			if !slices.Equal(dec.Endpoints, tc.endpoints) || !slices.Equal(dec.MetadataEndpoints, tc.endpoints) {
				t.Errorf("endpoints header %v metadata %v, want %v", dec.Endpoints, dec.MetadataEndpoints, tc.endpoints)
			}
			if !dec.ClearRouteCache {
				t.Error("clear_route_cache not set")
			}
			if !bytes.Equal(seen, tc.body) {
				t.Errorf("decider saw %d body bytes, want %d intact", len(seen), len(tc.body))
			}
			if !bytes.Equal(dec.Body, tc.wantBody) {
				t.Errorf("forwarded body has %d bytes (%.40q), want %d (%.40q)", len(dec.Body), dec.Body, len(tc.wantBody), tc.wantBody)
			}
			cl, ok := dec.Mutation.Get("content-length")
			if (tc.wantLength != "") != ok || cl != tc.wantLength {
				t.Errorf("content-length mutation %q (set %v), want %q", cl, ok, tc.wantLength)
			}
			// The client's own destination header must be overwritten, not
			// appended to.
			h := http.Header{"X-Gateway-Destination-Endpoint": {"6.6.6.6:1"}}
			dec.Mutation.Apply(h)
			if got := h.Values(extproc.HeaderDestinationEndpoint); len(got) != 1 || got[0] != joinEP(tc.endpoints) {
				t.Errorf("destination header after mutation %v", got)
			}
			_, out, err := ex.Respond(200, nil, []byte("data: 1\n\n"), []byte("data: [DONE]\n\n"))
			if err != nil {
				t.Fatalf("Respond: %v", err)
			}
			if string(out) != "data: 1\n\ndata: [DONE]\n\n" {
				t.Errorf("response body %q", out)
			}
		})
	}
}

func joinEP(e []string) string {
	s := ""
	for i, v := range e {
		if i > 0 {
			s += ","
		}
		s += v
	}
	return s
}

// TestStreamedBodyChunking checks the raw messages: a 200 kB body comes back
// as chunks of at most 62,000 bytes, intact and in order, after the headers
// answer, with end_of_stream on the last chunk only.
func TestStreamedBodyChunking(t *testing.T) {
	conn := startServer(t, fixed("10.0.0.1:8000"), extproc.Options{})
	s, _ := openStream(t, conn)
	body := pattern(200_000)
	send := func(m *extprocv3.ProcessingRequest) {
		t.Helper()
		if err := s.Send(m); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":path", RawValue: []byte("/")}}},
	}}})
	for off := 0; off < len(body); off += 16384 {
		end := min(off+16384, len(body))
		send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
			Body: body[off:end], EndOfStream: end == len(body),
		}}})
	}
	m, err := s.Recv()
	if err != nil {
		t.Fatalf("recv headers answer: %v", err)
	}
	if m.GetRequestHeaders() == nil {
		t.Fatalf("first answer is %T, want request headers", m.GetResponse())
	}
	var got []byte
	var sizes []int
	for {
		m, err := s.Recv()
		if err != nil {
			t.Fatalf("recv body chunk: %v", err)
		}
		sr := m.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			t.Fatalf("answer %v is not a streamed body response", m)
		}
		sizes = append(sizes, len(sr.GetBody()))
		got = append(got, sr.GetBody()...)
		if sr.GetEndOfStream() {
			break
		}
	}
	if !bytes.Equal(got, body) {
		t.Fatalf("streamed body differs: %d bytes back, want %d", len(got), len(body))
	}
	if want := []int{62000, 62000, 62000, 14000}; !slices.Equal(sizes, want) {
		t.Errorf("chunk sizes %v, want %v", sizes, want)
	}
}

// TestRequestTrailers: a streamed body ended by trailers is answered like
// one ended by end_of_stream, except the last chunk does not end the stream
// and the trailers get their own answer.
func TestRequestTrailers(t *testing.T) {
	conn := startServer(t, fixed("10.0.0.1:8000"), extproc.Options{})
	c := extprocclient.New(conn, extprocclient.Options{})
	ex, err := c.Start(context.Background(), extprocclient.RequestSpec{
		Body: []byte("abc"), Trailers: http.Header{"X-Checksum": {"1"}},
	})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer ex.Close()
	if d := ex.Decision(); !d.Routed() || string(d.Body) != "abc" || !slices.Equal(d.Endpoints, []string{"10.0.0.1:8000"}) {
		t.Fatalf("decision %+v", d)
	}
}

func TestBodyTooLarge(t *testing.T) {
	obs := newOutcomes()
	called := false
	d := deciderFunc(func(context.Context, *extproc.Request) (extproc.Decision, error) {
		called = true
		return extproc.Decision{Endpoints: []string{"10.0.0.1:1"}}, nil
	})
	conn := startServer(t, d, extproc.Options{MaxBodyBytes: 1000, Observer: obs})
	for _, mode := range []extprocclient.Mode{extprocclient.FullDuplex, extprocclient.Buffered} {
		c := extprocclient.New(conn, extprocclient.Options{Mode: mode, ChunkBytes: 300})
		ex, err := c.Start(context.Background(), extprocclient.RequestSpec{Body: pattern(5000)})
		if err != nil {
			t.Fatalf("mode %d: Start: %v", mode, err)
		}
		ex.Close()
		im := ex.Decision().Immediate
		if im == nil {
			t.Fatalf("mode %d: oversized body was routed", mode)
		}
		var eb struct{ Error string }
		if im.Status != 400 || im.Headers.Get(extproc.HeaderReason) != "body_too_large" ||
			im.Headers.Get("content-type") != "application/json" || json.Unmarshal(im.Body, &eb) != nil || eb.Error == "" {
			t.Errorf("mode %d: answer %d %v %s", mode, im.Status, im.Headers, im.Body)
		}
		if got := obs.next(t); got != extproc.OutcomeBodyTooLarge {
			t.Errorf("mode %d: outcome %q", mode, got)
		}
	}
	if called {
		t.Error("decider called for an oversized body")
	}
}

func TestReplyMapping(t *testing.T) {
	tests := []struct {
		name        string
		err         error
		wantStatus  int
		wantReason  string
		wantBody    string
		wantOutcome string
		wantRetry   string // the retry-after header; the server's default is 3s
	}{
		{name: "429 with body", err: &extproc.Reply{Status: 429, Reason: "queue_limit", Body: []byte(`{"error":"full","details":{"limit":4}}`)},
			wantStatus: 429, wantReason: "queue_limit", wantBody: `{"error":"full","details":{"limit":4}}`, wantOutcome: "queue_limit", wantRetry: "3"},
		{name: "429 with its own retry-after", err: &extproc.Reply{Status: 429, Reason: "queue_limit", Message: "full", RetryAfter: 1500 * time.Millisecond},
			wantStatus: 429, wantReason: "queue_limit", wantBody: `{"error":"full"}`, wantOutcome: "queue_limit", wantRetry: "2"},
		{name: "a retry-after below a second is one", err: &extproc.Reply{Status: 503, Reason: "no_endpoints", Message: "none", RetryAfter: time.Millisecond},
			wantStatus: 503, wantReason: "no_endpoints", wantBody: `{"error":"none"}`, wantOutcome: "no_endpoints", wantRetry: "1"},
		{name: "503 generated body", err: &extproc.Reply{Status: 503, Reason: "no_endpoints", Message: "no ready endpoint"},
			wantStatus: 503, wantReason: "no_endpoints", wantBody: `{"error":"no ready endpoint"}`, wantOutcome: "no_endpoints", wantRetry: "3"},
		{name: "400 malformed", err: &extproc.Reply{Status: 400, Reason: "malformed_body", Message: "body is not JSON"},
			wantStatus: 400, wantReason: "malformed_body", wantBody: `{"error":"body is not JSON"}`, wantOutcome: "malformed_body"},
		{name: "wrapped reply", err: fmt.Errorf("admit: %w", &extproc.Reply{Status: 429, Reason: "shed", Message: "expired"}),
			wantStatus: 429, wantReason: "shed", wantBody: `{"error":"expired"}`, wantOutcome: "shed", wantRetry: "3"},
		{name: "invalid status becomes 503", err: &extproc.Reply{Status: 0, Message: "x"},
			wantStatus: 503, wantBody: `{"error":"x"}`, wantOutcome: extproc.OutcomeRejected, wantRetry: "3"},
		{name: "plain error", err: errors.New("picker index broken"),
			wantStatus: 503, wantReason: "picker_error", wantBody: `{"error":"picker index broken"}`, wantOutcome: extproc.OutcomeDeciderError, wantRetry: "3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			obs := newOutcomes()
			d := deciderFunc(func(context.Context, *extproc.Request) (extproc.Decision, error) { return extproc.Decision{}, tc.err })
			conn := startServer(t, d, extproc.Options{Observer: obs, RetryAfter: 3 * time.Second})
			ex, err := extprocclient.New(conn, extprocclient.Options{}).Start(context.Background(), extprocclient.RequestSpec{Body: []byte("{}")})
			if err != nil {
				t.Fatalf("Start: %v", err)
			}
			ex.Close()
			im := ex.Decision().Immediate
			if im == nil {
				t.Fatal("routed, want immediate response")
			}
			if im.Status != tc.wantStatus || im.Headers.Get(extproc.HeaderReason) != tc.wantReason ||
				im.Headers.Get("content-type") != "application/json" || string(im.Body) != tc.wantBody {
				t.Errorf("got %d reason %q type %q body %s", im.Status, im.Headers.Get(extproc.HeaderReason), im.Headers.Get("content-type"), im.Body)
			}
			if got := im.Headers.Get(extproc.HeaderRetryAfter); got != tc.wantRetry {
				t.Errorf("retry-after %q, want %q", got, tc.wantRetry)
			}
			if got := obs.next(t); got != tc.wantOutcome {
				t.Errorf("outcome %q, want %q", got, tc.wantOutcome)
			}
		})
	}
}

func TestSubsetHintAndTestHeader(t *testing.T) {
	list := func(v ...string) *structpb.Value {
		vals := make([]*structpb.Value, len(v))
		for i, s := range v {
			vals[i] = structpb.NewStringValue(s)
		}
		return structpb.NewListValue(&structpb.ListValue{Values: vals})
	}
	tests := []struct {
		name        string
		hint        *structpb.Value // nil = key absent
		testHeader  *string
		noHooks     bool // serve without Options.ConformanceHooks
		wantSubset  []string
		wantHas     bool
		wantTestEPs []string
	}{
		{name: "absent"},
		{name: "list", hint: list("10.0.0.1:8000", "10.0.0.2"), wantSubset: []string{"10.0.0.1:8000", "10.0.0.2"}, wantHas: true},
		{name: "comma string", hint: structpb.NewStringValue(" 10.0.0.1:8000 ,10.0.0.2,"), wantSubset: []string{"10.0.0.1:8000", "10.0.0.2"}, wantHas: true},
		{name: "list of comma strings", hint: list("10.0.0.1:1,10.0.0.2:2", "10.0.0.3:3"), wantSubset: []string{"10.0.0.1:1", "10.0.0.2:2", "10.0.0.3:3"}, wantHas: true},
		{name: "empty list", hint: list(), wantSubset: []string{}, wantHas: true},
		{name: "empty string", hint: structpb.NewStringValue(""), wantSubset: []string{}, wantHas: true},
		{name: "test header", testHeader: ptr("10.0.0.9:8000, 10.0.0.8"), wantTestEPs: []string{"10.0.0.9:8000", "10.0.0.8"}},
		{name: "empty test header", testHeader: ptr("")},
		{name: "test header without the hooks", testHeader: ptr("10.0.0.9:8000"), noHooks: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got extproc.Request
			d := deciderFunc(func(_ context.Context, req *extproc.Request) (extproc.Decision, error) {
				got = *req
				return extproc.Decision{Endpoints: []string{"10.0.0.1:8000"}}, nil
			})
			conn := startServer(t, d, extproc.Options{ConformanceHooks: !tc.noHooks})
			s, _ := openStream(t, conn)
			hs := []*corev3.HeaderValue{{Key: ":path", RawValue: []byte("/")}}
			if tc.testHeader != nil {
				hs = append(hs, &corev3.HeaderValue{Key: extproc.HeaderTestEndpointSelection, RawValue: []byte(*tc.testHeader)})
			}
			msg := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
				Headers: &corev3.HeaderMap{Headers: hs}, EndOfStream: true,
			}}}
			if tc.hint != nil {
				msg.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
					extproc.MetadataNamespaceSubset: {Fields: map[string]*structpb.Value{extproc.MetadataKeySubset: tc.hint}},
				}}
			}
			if err := s.Send(msg); err != nil {
				t.Fatalf("send: %v", err)
			}
			if m, err := s.Recv(); err != nil || m.GetRequestHeaders() == nil {
				t.Fatalf("answer %v, %v", m, err)
			}
			if got.HasSubset != tc.wantHas || !slices.Equal(got.Subset, tc.wantSubset) || (got.Subset == nil) != (tc.wantSubset == nil) {
				t.Errorf("subset %#v has %v, want %#v has %v", got.Subset, got.HasSubset, tc.wantSubset, tc.wantHas)
			}
			if !slices.Equal(got.TestEndpoints, tc.wantTestEPs) || (got.TestEndpoints == nil) != (tc.wantTestEPs == nil) {
				t.Errorf("test endpoints %#v, want %#v", got.TestEndpoints, tc.wantTestEPs)
			}
		})
	}
}

func ptr(s string) *string { return &s }

func TestLifecycleAndResponsePath(t *testing.T) {
	tests := []struct {
		name       string
		conform    bool // the request carries the conformance header
		hooks      bool // Options.ConformanceHooks
		served     string
		play       func(ex *extprocclient.Exchange) ([]string, error) // returns response header values of interest
		reset      bool                                               // close the exchange before the response ends
		wantEvents []string
		wantServed string
	}{
		{
			name: "body chunks", wantEvents: []string{"first_byte", "done"},
			play: func(ex *extprocclient.Exchange) ([]string, error) {
				if _, err := ex.SendResponseHeaders(200, nil, false, ""); err != nil {
					return nil, err
				}
				for i, c := range []string{"", "data: a\n\n", "data: b\n\n"} {
					out, err := ex.SendResponseBody([]byte(c), i == 2)
					if err != nil || string(out) != c {
						return nil, fmt.Errorf("chunk %d echoed %q, %v", i, out, err)
					}
				}
				return nil, nil
			},
		},
		{
			name: "no body", wantEvents: []string{"first_byte", "done"},
			play: func(ex *extprocclient.Exchange) ([]string, error) {
				_, err := ex.SendResponseHeaders(204, nil, true, "")
				return nil, err
			},
		},
		{
			name: "reset before first byte", reset: true, wantEvents: []string{"done"},
			play: func(ex *extprocclient.Exchange) ([]string, error) {
				_, err := ex.SendResponseHeaders(200, nil, false, "")
				return nil, err
			},
		},
		{
			name: "reset mid body", reset: true, wantEvents: []string{"first_byte", "done"},
			play: func(ex *extprocclient.Exchange) ([]string, error) {
				if _, err := ex.SendResponseHeaders(200, nil, false, ""); err != nil {
					return nil, err
				}
				_, err := ex.SendResponseBody([]byte("x"), false)
				return nil, err
			},
		},
		{
			name: "conformance echo from metadata", conform: true, hooks: true, served: "10.0.0.2:8000",
			wantEvents: []string{"first_byte", "done"}, wantServed: "10.0.0.2:8000",
		},
		{
			name: "conformance echo falls back to the pick", conform: true, hooks: true,
			wantEvents: []string{"first_byte", "done"}, wantServed: "10.0.0.1:8000",
		},
		{
			name: "conformance header ignored without the hooks", conform: true, served: "10.0.0.2:8000",
			wantEvents: []string{"first_byte", "done"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lc := newLifecycle()
			var pins []string
			d := deciderFunc(func(_ context.Context, req *extproc.Request) (extproc.Decision, error) {
				pins = req.TestEndpoints
				return extproc.Decision{Endpoints: []string{"10.0.0.1:8000", "10.0.0.2:8000"}, Lifecycle: lc}, nil
			})
			conn := startServer(t, d, extproc.Options{ConformanceHooks: tc.hooks})
			h := http.Header{}
			if tc.conform {
				h.Set(extproc.HeaderTestEndpointSelection, "10.0.0.1:8000,10.0.0.2:8000")
			}
			ex, err := extprocclient.New(conn, extprocclient.Options{}).Start(context.Background(), extprocclient.RequestSpec{Headers: h, Body: []byte("{}")})
			if err != nil {
				t.Fatalf("Start: %v", err)
			}
			if wantPins := tc.conform && tc.hooks; (pins != nil) != wantPins {
				t.Errorf("Request.TestEndpoints = %v, want set: %t", pins, wantPins)
			}
			if tc.play != nil {
				if _, err := tc.play(ex); err != nil {
					t.Fatalf("play: %v", err)
				}
			} else {
				mut, err := ex.SendResponseHeaders(200, nil, false, tc.served)
				if err != nil {
					t.Fatalf("response headers: %v", err)
				}
				got, _ := mut.Get(extproc.HeaderConformanceServed)
				if got != tc.wantServed {
					t.Errorf("served echo %q, want %q", got, tc.wantServed)
				}
				if _, err := ex.SendResponseBody([]byte("ok"), true); err != nil {
					t.Fatalf("response body: %v", err)
				}
			}
			if err := ex.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if ev := lc.wait(t); !slices.Equal(ev, tc.wantEvents) {
				t.Errorf("lifecycle events %v, want %v", ev, tc.wantEvents)
			}
		})
	}
}

// TestNoConformanceEchoByDefault: without the conformance request header the
// response headers pass unchanged.
func TestNoConformanceEchoByDefault(t *testing.T) {
	conn := startServer(t, fixed("10.0.0.1:8000"), extproc.Options{})
	ex, err := extprocclient.New(conn, extprocclient.Options{}).Start(context.Background(), extprocclient.RequestSpec{})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer ex.Close()
	mut, err := ex.SendResponseHeaders(200, nil, true, "10.0.0.1:8000")
	if err != nil {
		t.Fatalf("response headers: %v", err)
	}
	if len(mut.Set) != 0 || len(mut.Remove) != 0 {
		t.Errorf("response header mutation %+v, want none", mut)
	}
}

// TestClientGoneWhileDeciding: the gateway cancels the stream while the
// request waits in the Decider. The Decider's ctx must end, nothing may be
// sent, and no stream goroutine may be left behind.
func TestClientGoneWhileDeciding(t *testing.T) {
	waitNoProcessGoroutines(t) // earlier tests' streams
	obs := newOutcomes()
	entered := make(chan struct{})
	ctxErr := make(chan error, 1)
	d := deciderFunc(func(ctx context.Context, _ *extproc.Request) (extproc.Decision, error) {
		close(entered)
		<-ctx.Done()
		ctxErr <- ctx.Err()
		return extproc.Decision{}, ctx.Err()
	})
	conn := startServer(t, d, extproc.Options{Observer: obs})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := extprocclient.New(conn, extprocclient.Options{}).Start(ctx, extprocclient.RequestSpec{Body: []byte("{}")})
		errc <- err
	}()
	<-entered
	cancel()
	if err := <-ctxErr; !errors.Is(err, context.Canceled) {
		t.Errorf("decider ctx ended with %v, want context.Canceled", err)
	}
	if err := <-errc; status.Code(err) != codes.Canceled {
		t.Errorf("Start returned %v, want a cancellation (no answer)", err)
	}
	if got := obs.next(t); got != extproc.OutcomeClientGone {
		t.Errorf("outcome %q, want %q", got, extproc.OutcomeClientGone)
	}
	waitNoProcessGoroutines(t)
}

// TestClientGoneNoAnswer checks on the wire that a stream whose gateway went
// away gets no message: a second, healthy stream on the same connection is
// answered normally, and the cancelled one saw only its cancellation.
func TestClientGoneNoAnswer(t *testing.T) {
	entered := make(chan struct{}, 1)
	d := deciderFunc(func(ctx context.Context, req *extproc.Request) (extproc.Decision, error) {
		if req.Headers["x-block"] == "1" {
			entered <- struct{}{}
			<-ctx.Done()
			return extproc.Decision{}, ctx.Err()
		}
		return extproc.Decision{Endpoints: []string{"10.0.0.1:1"}}, nil
	})
	conn := startServer(t, d, extproc.Options{})
	s, cancel := openStream(t, conn)
	if err := s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: "x-block", RawValue: []byte("1")}}}, EndOfStream: true,
	}}}); err != nil {
		t.Fatalf("send: %v", err)
	}
	<-entered
	cancel()
	m, err := s.Recv()
	if status.Code(err) != codes.Canceled {
		t.Errorf("cancelled stream received %v, %v; want only its cancellation", m, err)
	}
	ex, err := extprocclient.New(conn, extprocclient.Options{}).Start(context.Background(), extprocclient.RequestSpec{})
	if err != nil || !ex.Decision().Routed() {
		t.Fatalf("healthy stream after a cancelled one: %v", err)
	}
	ex.Close()
	waitNoProcessGoroutines(t)
}

func TestProtocolErrors(t *testing.T) {
	tests := []struct {
		name string
		msgs []*extprocv3.ProcessingRequest
		want codes.Code
	}{
		{
			name: "response headers before the answer",
			msgs: []*extprocv3.ProcessingRequest{{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{}}}},
			want: codes.InvalidArgument,
		},
		{
			name: "STREAMED request body mode",
			msgs: []*extprocv3.ProcessingRequest{{
				Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}},
				ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_STREAMED},
			}},
			want: codes.FailedPrecondition,
		},
		{
			name: "observability mode",
			msgs: []*extprocv3.ProcessingRequest{{
				Request:           &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}},
				ObservabilityMode: true,
			}},
			want: codes.FailedPrecondition,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			obs := newOutcomes()
			conn := startServer(t, fixed("10.0.0.1:1"), extproc.Options{Observer: obs})
			s, _ := openStream(t, conn)
			for _, m := range tc.msgs {
				if err := s.Send(m); err != nil {
					t.Fatalf("send: %v", err)
				}
			}
			_, err := s.Recv()
			if status.Code(err) != tc.want {
				t.Errorf("stream ended with %v, want code %v", err, tc.want)
			}
			if got := obs.next(t); got != extproc.OutcomeProtocolError {
				t.Errorf("outcome %q", got)
			}
		})
	}
}

// TestRequestBodyModeNone: with request_body_mode NONE the headers are all
// the picker gets, so it decides on them even without end_of_stream.
func TestRequestBodyModeNone(t *testing.T) {
	conn := startServer(t, fixed("10.0.0.7:8000"), extproc.Options{})
	s, _ := openStream(t, conn)
	if err := s.Send(&extprocv3.ProcessingRequest{
		Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_NONE, ResponseBodyMode: filterv3.ProcessingMode_NONE},
	}); err != nil {
		t.Fatalf("send: %v", err)
	}
	m, err := s.Recv()
	if err != nil {
		t.Fatalf("recv: %v", err)
	}
	set := m.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders()
	if len(set) != 1 || string(set[0].GetHeader().GetRawValue()) != "10.0.0.7:8000" {
		t.Errorf("headers answer %v", m)
	}
}

// TestImmediateResponseEndsStream: after an immediate response the server
// ends the stream, so a gateway that keeps streaming body chunks is not
// left waiting.
func TestImmediateResponseEndsStream(t *testing.T) {
	d := deciderFunc(func(context.Context, *extproc.Request) (extproc.Decision, error) {
		return extproc.Decision{}, &extproc.Reply{Status: 429, Reason: "queue_limit"}
	})
	conn := startServer(t, d, extproc.Options{})
	s, _ := openStream(t, conn)
	_ = s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{EndOfStream: true}}})
	m, err := s.Recv()
	if err != nil || m.GetImmediateResponse().GetStatus().GetCode() != 429 {
		t.Fatalf("answer %v, %v", m, err)
	}
	if _, err := s.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("after the immediate response got %v, want end of stream", err)
	}
}

// TestReplyError documents the Reply's error text.
func TestReplyError(t *testing.T) {
	r := &extproc.Reply{Status: 429, Reason: "queue_limit", Message: "class premium full"}
	if got, want := r.Error(), "reply 429 queue_limit: class premium full"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

// TestHeaderPickOnly: for gateways whose ORIGINAL_DST cluster reads the
// header as one address, the header carries only the pick and the metadata
// keeps the fallbacks.
func TestHeaderPickOnly(t *testing.T) {
	eps := []string{"10.0.0.1:8000", "10.0.0.2:8000"}
	conn := startServer(t, fixed(eps...), extproc.Options{HeaderPickOnly: true})
	ex, err := extprocclient.New(conn, extprocclient.Options{}).Start(context.Background(), extprocclient.RequestSpec{Body: []byte("{}")})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer ex.Close()
	d := ex.Decision()
	if !slices.Equal(d.Endpoints, eps[:1]) || !slices.Equal(d.MetadataEndpoints, eps) {
		t.Errorf("header %v metadata %v, want header %v metadata %v", d.Endpoints, d.MetadataEndpoints, eps[:1], eps)
	}
}

// TestDeciderPanicContained: a Decider that panics gets its stream
// answered 500 with a JSON error, outcome panic; the server serves the
// next stream as before.
func TestDeciderPanicContained(t *testing.T) {
	obs := newOutcomes()
	d := deciderFunc(func(_ context.Context, req *extproc.Request) (extproc.Decision, error) {
		if req.Headers["x-boom"] != "" {
			panic("boom")
		}
		return extproc.Decision{Endpoints: []string{"10.0.0.1:8000"}}, nil
	})
	conn := startServer(t, d, extproc.Options{Observer: obs})
	c := extprocclient.New(conn, extprocclient.Options{})
	ex, err := c.Start(context.Background(), extprocclient.RequestSpec{Headers: http.Header{"x-boom": {"1"}}, Body: []byte("{}")})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	ex.Close()
	im := ex.Decision().Immediate
	if im == nil || im.Status != 500 || im.Headers.Get(extproc.HeaderReason) != "internal_error" || !json.Valid(im.Body) {
		t.Fatalf("answer %+v, want 500 internal_error with a JSON body", im)
	}
	if got := obs.next(t); got != extproc.OutcomePanic {
		t.Errorf("outcome %q, want %q", got, extproc.OutcomePanic)
	}
	ex, err = c.Start(context.Background(), extprocclient.RequestSpec{Body: []byte("{}")})
	if err != nil || !ex.Decision().Routed() {
		t.Fatalf("next stream: %v %+v, want routed", err, ex.Decision().Immediate)
	}
	ex.Close()
}

// TestDecisionHeaders: a Decision's own request headers reach the gateway
// in every answer mode, overwriting the client's value, and its removals
// strip the client's header.
func TestDecisionHeaders(t *testing.T) {
	for _, mode := range []extprocclient.Mode{extprocclient.FullDuplex, extprocclient.Buffered} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			d := deciderFunc(func(_ context.Context, req *extproc.Request) (extproc.Decision, error) {
				return extproc.Decision{Endpoints: []string{"10.0.0.1:8000"},
					Headers:       []extproc.Header{{Name: "x-prefiller-host-port", Value: "10.0.0.9:8000"}},
					RemoveHeaders: []string{"x-smuggled"}}, nil
			})
			conn := startServer(t, d, extproc.Options{})
			ex, err := extprocclient.New(conn, extprocclient.Options{Mode: mode}).Start(context.Background(), extprocclient.RequestSpec{
				Path: "/v1/completions", Body: []byte(`{}`),
				Headers: http.Header{"X-Prefiller-Host-Port": {"6.6.6.6:1"}, "X-Smuggled": {"1"}},
			})
			if err != nil {
				t.Fatalf("Start: %v", err)
			}
			defer ex.Close()
			h := http.Header{"X-Prefiller-Host-Port": {"6.6.6.6:1"}, "X-Smuggled": {"1"}}
			dec := ex.Decision()
			dec.Mutation.Apply(h)
			if got := h.Values("x-prefiller-host-port"); len(got) != 1 || got[0] != "10.0.0.9:8000" {
				t.Errorf("x-prefiller-host-port after the mutation %v, want only 10.0.0.9:8000", got)
			}
			if h.Get("x-smuggled") != "" || h.Get(extproc.HeaderDestinationEndpoint) != "10.0.0.1:8000" {
				t.Errorf("headers after the mutation %v", h)
			}
		})
	}
}

// TestHeaderOnlyGateways: gateways that send no response phase (NGINX
// Gateway Fabric's shim, Envoy with the response phases skipped)
// half-close the stream after the request and read it until the picker
// ends it. The picker reads header values from value as well as
// raw_value, answers, ends the stream on the half-close (the client sees
// io.EOF: Start returns) and reports the request done, with no first
// byte since none was seen.
func TestHeaderOnlyGateways(t *testing.T) {
	tests := []struct {
		name   string
		shape  extprocclient.Shape
		perReq bool
		body   []byte
	}{
		{name: "nginx shim", shape: extprocclient.NginxShim, perReq: true, body: []byte(`{"prompt":"p"}`)},
		{name: "nginx shim without a body", shape: extprocclient.NginxShim, perReq: true},
		{name: "envoy skip", shape: extprocclient.EnvoySkip, body: pattern(3*extproc.MaxChunkBytes + 5)},
		{name: "envoy skip without a body", shape: extprocclient.EnvoySkip},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			obs := newOutcomes()
			lc := newLifecycle()
			seen := make(chan map[string]string, 1)
			d := deciderFunc(func(_ context.Context, req *extproc.Request) (extproc.Decision, error) {
				seen <- req.Headers
				return extproc.Decision{Endpoints: []string{"10.0.0.1:8000"}, Lifecycle: lc}, nil
			})
			conn := startServer(t, d, extproc.Options{Observer: obs})
			opts := extprocclient.Options{Shape: tc.shape}
			c := extprocclient.New(conn, opts)
			if tc.perReq {
				c = extprocclient.NewPerRequest(func() (*grpc.ClientConn, error) {
					return grpc.NewClient(conn.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
				}, opts)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			ex, err := c.Start(ctx, extprocclient.RequestSpec{Headers: http.Header{"X-Class": {"premium"}}, Body: tc.body})
			if err != nil {
				t.Fatalf("Start: %v", err)
			}
			defer ex.Close()
			if !ex.Ended() {
				t.Error("the picker did not end the stream")
			}
			if dd := ex.Decision(); !dd.Routed() || !slices.Equal(dd.Endpoints, []string{"10.0.0.1:8000"}) || !bytes.Equal(dd.Body, tc.body) {
				t.Errorf("decision %+v", dd)
			}
			h := <-seen
			wantLen := ""
			if len(tc.body) > 0 {
				wantLen = strconv.Itoa(len(tc.body))
			}
			if h["x-class"] != "premium" || h["content-length"] != wantLen {
				t.Errorf("picker read x-class %q, content-length %q; want premium, %q", h["x-class"], h["content-length"], wantLen)
			}
			if got := obs.next(t); got != extproc.OutcomeRouted {
				t.Errorf("outcome %q, want %q", got, extproc.OutcomeRouted)
			}
			if ev := lc.wait(t); !slices.Equal(ev, []string{"done"}) {
				t.Errorf("lifecycle events %v, want [done]", ev)
			}
		})
	}
}
