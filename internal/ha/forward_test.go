package ha

import (
	"context"
	"errors"
	"io"
	"sync"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// immediate503 is a leader's ImmediateResponse with an x-laneway-reason.
func immediate503(code typev3.StatusCode, reason string, raw bool) *extprocv3.ProcessingResponse {
	h := &corev3.HeaderValue{Key: "x-laneway-reason", Value: reason}
	if raw {
		h = &corev3.HeaderValue{Key: "x-laneway-reason", RawValue: []byte(reason)}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: code},
		Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{Header: h}}},
	}}}
}

// refusals are the picker's replica-local 503 reasons (internal/epp's
// ReasonNotReady, ReasonPolicyInvalid and ReasonShuttingDown).
var refusals = []string{"not_ready", "policy_invalid", "shutting_down"}

func TestLocalRefusal(t *testing.T) {
	tests := []struct {
		name string
		resp *extprocv3.ProcessingResponse
		want string
	}{
		{"shutting down", immediate503(typev3.StatusCode_ServiceUnavailable, "shutting_down", false), "shutting_down"},
		{"not ready, raw value", immediate503(typev3.StatusCode_ServiceUnavailable, "not_ready", true), "not_ready"},
		{"policy invalid", immediate503(typev3.StatusCode_ServiceUnavailable, "policy_invalid", false), "policy_invalid"},
		{"no endpoints is the pool's answer", immediate503(typev3.StatusCode_ServiceUnavailable, "no_endpoints", false), ""},
		{"a 429 is the client's answer", immediate503(typev3.StatusCode_TooManyRequests, "shutting_down", false), ""},
		{"a pick", &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{}}, ""},
	}
	for _, tt := range tests {
		if got := localRefusal(tt.resp, refusals); got != tt.want {
			t.Errorf("%s: localRefusal = %q, want %q", tt.name, got, tt.want)
		}
	}
}

// fakeGateway is the gateway's side of a server stream: Recv hands out
// msgs, then io.EOF.
type fakeGateway struct {
	grpc.ServerStream
	ctx  context.Context
	msgs chan *extprocv3.ProcessingRequest
}

func (g *fakeGateway) Context() context.Context { return g.ctx }
func (g *fakeGateway) Recv() (*extprocv3.ProcessingRequest, error) {
	select {
	case m, ok := <-g.msgs:
		if !ok {
			return nil, io.EOF
		}
		return m, nil
	case <-g.ctx.Done():
		return nil, g.ctx.Err()
	}
}
func (g *fakeGateway) Send(*extprocv3.ProcessingResponse) error { return nil }

// TestPumpDivert: messages kept before a divert are replayed in order, and
// the gateway's later ones, and its end, follow through the replay stream;
// a stream past replayLimit cannot be diverted.
func TestPumpDivert(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gw := &fakeGateway{ctx: ctx, msgs: make(chan *extprocv3.ProcessingRequest)}
	p := &pump{gw: gw, kept: true, rest: make(chan recvResult)}
	p.broken.Store(true) // no upstream: only keep
	go p.run(func() {})
	msg := func(i int) *extprocv3.ProcessingRequest {
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte{byte(i)}}}}
	}
	gw.msgs <- msg(0)
	gw.msgs <- msg(1)
	gw.msgs <- msg(2) // the pump has taken msg(1) once this send returns
	rs, ok := p.divert()
	if !ok {
		t.Fatal("divert of a kept stream failed")
	}
	rs.ExternalProcessor_ProcessServer = gw
	go func() { gw.msgs <- msg(3); close(gw.msgs) }()
	for i := 0; i < 4; i++ {
		m, err := rs.Recv()
		if err != nil || m.GetRequestBody().GetBody()[0] != byte(i) {
			t.Fatalf("replay message %d: %v %v", i, m, err)
		}
	}
	if _, err := rs.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the replay: %v, want io.EOF", err)
	}
	if _, err := rs.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("Recv after the end: %v, want io.EOF again", err)
	}

	big := &pump{gw: &fakeGateway{ctx: ctx, msgs: make(chan *extprocv3.ProcessingRequest, 1)}, kept: true, rest: make(chan recvResult)}
	big.broken.Store(true)
	go big.run(func() {})
	bg := big.gw.(*fakeGateway)
	bg.msgs <- &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: make([]byte, replayLimit+1)}}}
	bg.msgs <- msg(1) // taken only after the big one was counted
	bg.msgs <- msg(2)
	if _, ok := big.divert(); ok {
		t.Error("a stream past replayLimit was diverted")
	}
}

// countingBudget is a held-body budget that records what is taken.
type countingBudget struct {
	mu          sync.Mutex
	limit, held int64
}

func (b *countingBudget) ReserveHeldBodyBytes(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held+n > b.limit {
		return false
	}
	b.held += n
	return true
}

func (b *countingBudget) ReleaseHeldBodyBytes(n int64) {
	b.mu.Lock()
	b.held -= n
	b.mu.Unlock()
}

func (b *countingBudget) now() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held
}

// TestPumpCountsCopiesInTheBudget: the kept messages hold their bytes in
// the replica's budget; a message the budget cannot take ends the keeping
// and gives every kept byte back; commit and divert give them back too.
func TestPumpCountsCopiesInTheBudget(t *testing.T) {
	body := func(n int) *extprocv3.ProcessingRequest {
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: make([]byte, n)}}}
	}
	size := int64(proto.Size(body(1000)))
	tests := []struct {
		name      string
		limit     int64
		end       func(p *pump) bool // ends the keeping; reports whether the copy was diverted
		wantKept  int64              // bytes held after two messages
		wantAfter bool               // divert succeeds
	}{
		{"both fit, commit", 3 * size, func(p *pump) bool { p.commit(); return false }, 2 * size, false},
		{"both fit, divert", 3 * size, func(p *pump) bool { _, ok := p.divert(); return ok }, 2 * size, true},
		{"the second does not fit", size + size/2, func(p *pump) bool { _, ok := p.divert(); return ok }, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			b := &countingBudget{limit: tt.limit}
			gw := &fakeGateway{ctx: ctx, msgs: make(chan *extprocv3.ProcessingRequest, 2)}
			p := &pump{gw: gw, held: b, kept: true, rest: make(chan recvResult)}
			p.broken.Store(true)
			gw.msgs <- body(1000)
			gw.msgs <- body(1000)
			close(gw.msgs)
			p.run(func() {}) // returns at the gateway's end, both messages counted
			if got := b.now(); got != tt.wantKept {
				t.Fatalf("budget holds %d bytes for two kept %d-byte messages, want %d", got, size, tt.wantKept)
			}
			if got := tt.end(p); got != tt.wantAfter {
				t.Errorf("diverted = %v, want %v", got, tt.wantAfter)
			}
			if got := b.now(); got != 0 {
				t.Errorf("budget holds %d bytes after the keeping ended, want 0", got)
			}
		})
	}
}
