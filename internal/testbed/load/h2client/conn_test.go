package h2client

import (
	"context"
	"errors"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// echo is a minimal FULL_DUPLEX_STREAMED processor: it routes at the end of
// the request body and streams every body back. rejectFrom, when set,
// answers that many bytes and more with an immediate 413; failTag makes
// the stream fail with a gRPC status when a header of that name is sent.
type echo struct {
	extprocv3.UnimplementedExternalProcessorServer
	rejectFrom int
	failHeader string
}

func (e echo) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	var body int
	for {
		req, err := s.Recv()
		if err != nil {
			return nil
		}
		var resp *extprocv3.ProcessingResponse
		switch r := req.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			for _, h := range r.RequestHeaders.GetHeaders().GetHeaders() {
				if e.failHeader != "" && h.GetKey() == e.failHeader {
					return status.Error(codes.FailedPrecondition, "told to fail")
				}
			}
			continue
		case *extprocv3.ProcessingRequest_RequestBody:
			body += len(r.RequestBody.Body)
			if e.rejectFrom > 0 && body >= e.rejectFrom {
				resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
					ImmediateResponse: &extprocv3.ImmediateResponse{Status: &typev3.HttpStatus{Code: typev3.StatusCode_PayloadTooLarge}},
				}}
				if err := s.Send(resp); err != nil {
					return err
				}
				return nil
			}
			if r.RequestBody.EndOfStream {
				if err := s.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
					Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
						{Header: &corev3.HeaderValue{Key: "x-gateway-destination-endpoint", RawValue: []byte("127.0.0.1:1")}},
					}}},
				}}}); err != nil {
					return err
				}
			}
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
				Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
					StreamedResponse: &extprocv3.StreamedBodyResponse{Body: r.RequestBody.Body, EndOfStream: r.RequestBody.EndOfStream},
				}}},
			}}}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
		case *extprocv3.ProcessingRequest_ResponseBody:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{
				Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
					StreamedResponse: &extprocv3.StreamedBodyResponse{Body: r.ResponseBody.Body, EndOfStream: r.ResponseBody.EndOfStream},
				}}},
			}}}
		default:
			continue
		}
		if err := s.Send(resp); err != nil {
			return err
		}
	}
}

// serve starts e on a loopback port with grpc-go's default (small, dynamic)
// flow-control windows, so large bodies must wait for WINDOW_UPDATEs.
func serve(t *testing.T, e echo) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, e)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return lis.Addr().String()
}

// recorder collects callbacks and checks each stream is done exactly once.
type recorder struct {
	t         *testing.T
	mu        sync.Mutex
	decisions map[int]Decision
	done      map[int]error
	all       chan struct{}
	want      int
	// decidedN, when set, is closed once that many decisions arrived.
	decidedN   int
	allDecided chan struct{}
}

func newRecorder(t *testing.T, want int) *recorder {
	return &recorder{t: t, decisions: map[int]Decision{}, done: map[int]error{}, all: make(chan struct{}), want: want,
		allDecided: make(chan struct{})}
}

func (r *recorder) decided(tag int, d Decision) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.decisions[tag]; dup {
		r.t.Errorf("stream %d decided twice", tag)
	}
	r.decisions[tag] = d
	if len(r.decisions) == r.decidedN {
		close(r.allDecided)
	}
}

func (r *recorder) finished(tag int, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.done[tag]; dup {
		r.t.Errorf("stream %d done twice", tag)
	}
	r.done[tag] = err
	if len(r.done) == r.want {
		close(r.all)
	}
}

func (r *recorder) wait(t *testing.T) {
	t.Helper()
	select {
	case <-r.all:
	case <-time.After(20 * time.Second):
		r.mu.Lock()
		defer r.mu.Unlock()
		t.Fatalf("%d of %d streams done", len(r.done), r.want)
	}
}

func dial(t *testing.T, addr string, plan *Plan, hold time.Duration, r *recorder) *Conn {
	t.Helper()
	c, err := Dial(context.Background(), addr, Options{Plan: plan, Hold: hold, OnDecision: r.decided, OnDone: r.finished, WireStamps: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func plan(t *testing.T, body int, headers map[string]string) *Plan {
	t.Helper()
	return planOf(t, Exchange{Path: "/v1/completions", Body: []byte(strings.Repeat("x", body)), ResponseBody: []byte("data: [DONE]\n\n")}, headers)
}

func planOf(t *testing.T, ex Exchange, headers map[string]string) *Plan {
	t.Helper()
	if headers != nil {
		ex.Headers = map[string][]string{}
		for k, v := range headers {
			ex.Headers[k] = []string{v}
		}
	}
	p, err := NewPlan(ex)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestExchanges(t *testing.T) {
	for _, tc := range []struct {
		name    string
		srv     echo
		body    int
		headers map[string]string
		hold    time.Duration
		streams int
		// headerOnly plays no response phase: the picker ends each
		// stream after its answer, whatever the hold.
		headerOnly bool
		// want: Decision.Status (-1: no decision) and an error substring
		// ("" for a completed exchange).
		status  int
		wantErr string
	}{
		{name: "routed", body: 1500, hold: 5 * time.Millisecond, streams: 100},
		{name: "routed without hold", body: 1500, streams: 100},
		{name: "header only", body: 1500, hold: time.Hour, streams: 100, headerOnly: true},
		{name: "header only, flow control", body: 300_000, hold: time.Hour, streams: 20, headerOnly: true},
		// 300 kB per stream against 64 kB windows: five body messages,
		// paced by WINDOW_UPDATEs on the stream and the connection.
		{name: "flow control", body: 300_000, streams: 20},
		{name: "immediate", srv: echo{rejectFrom: 100_000}, body: 300_000, streams: 10, status: 413},
		{name: "grpc error", srv: echo{failHeader: "x-fail"}, body: 10, headers: map[string]string{"x-fail": "1"}, streams: 5, status: -1, wantErr: "grpc-status 9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := serve(t, tc.srv)
			r := newRecorder(t, tc.streams)
			ex := Exchange{Path: "/v1/completions", Body: []byte(strings.Repeat("x", tc.body)), ResponseBody: []byte("data: [DONE]\n\n"), HeaderOnly: tc.headerOnly}
			c := dial(t, addr, planOf(t, ex, tc.headers), tc.hold, r)
			for i := range tc.streams {
				c.Start(i)
			}
			r.wait(t)
			r.mu.Lock()
			defer r.mu.Unlock()
			for i := range tc.streams {
				d, decided := r.decisions[i]
				switch {
				case tc.status < 0 && decided:
					t.Errorf("stream %d: decision %+v, want none", i, d)
				case tc.status >= 0 && !decided:
					t.Errorf("stream %d: no decision", i)
				case decided && (d.Status != tc.status || d.Latency <= 0):
					t.Errorf("stream %d: decision %+v, want status %d and a latency", i, d, tc.status)
				case decided && runtime.GOOS == "linux" && (d.Wire <= 0 || d.Wire > d.Latency):
					// The answer was in the kernel before the reader had it.
					t.Errorf("stream %d: decision %+v, want 0 < Wire <= Latency", i, d)
				}
				err := r.done[i]
				if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
					t.Errorf("stream %d done with %v, want %q", i, err, tc.wantErr)
				}
			}
		})
	}
}

// TestCloseEndsOpenStreams: streams waiting out their hold are done once
// each with ErrClosed, and Start after Close fails at once.
func TestCloseEndsOpenStreams(t *testing.T) {
	addr := serve(t, echo{})
	r := newRecorder(t, 11)
	r.decidedN = 10
	c := dial(t, addr, plan(t, 100, nil), time.Hour, r)
	for i := range 10 {
		c.Start(i)
	}
	select {
	case <-r.allDecided:
	case <-time.After(10 * time.Second):
		t.Fatal("10 streams not decided within 10 s")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c.Start(10)
	r.wait(t)
	for i := range 11 {
		if err := r.done[i]; !errors.Is(err, ErrClosed) {
			t.Errorf("stream %d done with %v, want ErrClosed", i, err)
		}
	}
}

func TestResponseKind(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  []byte
		want int
	}{
		{"empty", nil, 0},
		{"garbage", []byte{0xff, 0xff, 0xff}, 0},
		{"request headers", []byte{0x0a, 0x00}, fieldRequestHeaders},
		// dynamic_metadata (field 8) first, then the immediate response.
		{"metadata first", []byte{0x42, 0x00, 0x3a, 0x00}, fieldImmediate},
	} {
		got, _, err := responseKind(tc.msg)
		if int(got) != tc.want || (tc.want == 0) != (err != nil) {
			t.Errorf("%s: responseKind = %d, %v; want %d", tc.name, got, err, tc.want)
		}
	}
}

// TestPlanOf: with PlanOf each stream plays the plan chosen by its tag:
// even tags a small body the processor routes, odd tags one it rejects.
func TestPlanOf(t *testing.T) {
	addr := serve(t, echo{rejectFrom: 100_000})
	small, large := plan(t, 1500, nil), plan(t, 150_000, nil)
	const n = 40
	r := newRecorder(t, n)
	c, err := Dial(context.Background(), addr, Options{
		PlanOf: func(tag int) *Plan {
			if tag%2 == 0 {
				return small
			}
			return large
		},
		Hold: time.Millisecond, OnDecision: r.decided, OnDone: r.finished,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	for i := range n {
		c.Start(i)
	}
	r.wait(t)
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range n {
		want := 0
		if i%2 == 1 {
			want = 413
		}
		if d := r.decisions[i]; d.Status != want || r.done[i] != nil {
			t.Errorf("stream %d: decision %+v done %v, want status %d and a clean end", i, d, r.done[i], want)
		}
	}
	if _, err := Dial(context.Background(), addr, Options{OnDone: r.finished}); err == nil {
		t.Error("Dial without Plan or PlanOf succeeded")
	}
}
