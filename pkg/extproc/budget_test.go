package extproc

import (
	"context"
	"encoding/json"
	"io"
	"strconv"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// decideFunc adapts a function to Decider.
type decideFunc func(context.Context, *Request) (Decision, error)

func (f decideFunc) Decide(ctx context.Context, r *Request) (Decision, error) { return f(ctx, r) }

// pickOne routes every request to one endpoint.
var pickOne = decideFunc(func(context.Context, *Request) (Decision, error) {
	return Decision{Endpoints: []string{"10.0.0.1:8000"}}, nil
})

// sink is a stream's server side that keeps what the stream sends.
type sink struct {
	grpc.ServerStream // nil: only Send and Context are used
	sent              []*extprocv3.ProcessingResponse
}

func (s *sink) Send(r *extprocv3.ProcessingResponse) error  { s.sent = append(s.sent, r); return nil }
func (s *sink) Context() context.Context                    { return context.Background() }
func (s *sink) Recv() (*extprocv3.ProcessingRequest, error) { return nil, io.EOF }

// budgetStream is a FULL_DUPLEX_STREAMED stream of a server whose held-body
// budget is limit bytes, with limit-free bytes already held by others.
func budgetStream(limit, others int64, d Decider) (*stream, *sink) {
	s := NewServer(d, Options{MaxHeldBodyBytes: limit, MaxBodyBytes: 64 << 20})
	s.held.force(others)
	out := &sink{}
	st := &stream{s: s, srv: out, ctx: context.Background(), started: true,
		reqMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, respMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
	return st, out
}

// headers plays the request headers, with content-length unless n < 0.
func headers(t *testing.T, st *stream, n int) bool {
	t.Helper()
	hs := []*corev3.HeaderValue{{Key: ":path", RawValue: []byte("/")}}
	if n >= 0 {
		hs = append(hs, &corev3.HeaderValue{Key: "content-length", RawValue: []byte(strconv.Itoa(n))})
	}
	end, err := st.onRequestHeaders(&extprocv3.ProcessingRequest{}, &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}})
	if err != nil {
		t.Fatalf("headers: %v", err)
	}
	return end
}

// chunk plays one request body message.
func chunk(t *testing.T, st *stream, n int, eos bool) bool {
	t.Helper()
	end, err := st.onRequestBody(&extprocv3.HttpBody{Body: make([]byte, n), EndOfStream: eos})
	if err != nil {
		t.Fatalf("body: %v", err)
	}
	return end
}

// heldAnswer returns the 429 held_bytes details of the last message sent,
// or fails.
func heldAnswer(t *testing.T, out *sink) heldBytesDetails {
	t.Helper()
	if len(out.sent) == 0 {
		t.Fatal("nothing sent, want 429 held_bytes")
	}
	ir := out.sent[len(out.sent)-1].GetImmediateResponse()
	var b struct{ Details heldBytesDetails }
	if ir.GetStatus().GetCode() != 429 || json.Unmarshal(ir.GetBody(), &b) != nil {
		t.Fatalf("last message %v, want 429 held_bytes", out.sent[len(out.sent)-1])
	}
	return b.Details
}

// TestHeldBodyAccounting: how one stream's body is allocated and counted
// against the budget.
func TestHeldBodyAccounting(t *testing.T) {
	const mib = 1 << 20
	t.Run("content-length reserves nothing; the first buffer is at most 64 KiB, then doubles", func(t *testing.T) {
		st, _ := budgetStream(64*mib, 0, pickOne)
		headers(t, st, 15_000_000)
		if got := st.s.HeldBodyBytes(); got != 0 {
			t.Errorf("body bytes held after the headers %d, want 0: an announcement is not a body", got)
		}
		chunk(t, st, 1, false)
		if got, c := st.s.HeldBodyBytes(), cap(st.req.Body); c != bodySlice || got != int64(c) {
			t.Errorf("after one byte: capacity %d, held %d; want both %d", c, got, bodySlice)
		}
		for _, want := range []int{600_001, 1_200_002, 2_400_004} { // doubling, or the need when that is more
			chunk(t, st, 600_000, false)
			if got, c := st.s.HeldBodyBytes(), cap(st.req.Body); c != want || got != int64(c) {
				t.Errorf("at %d bytes: capacity %d, held %d; want both %d", len(st.req.Body), c, got, want)
			}
		}
	})
	t.Run("an announced body larger than the budget's room is not refused at the headers", func(t *testing.T) {
		st, out := budgetStream(20*mib, 10*mib, pickOne)
		if headers(t, st, 15*mib) || len(out.sent) != 0 {
			t.Fatalf("stream answered %v at its headers, want it to go on", out.sent)
		}
		if got := st.s.HeldBodyBytes(); got != 10*mib {
			t.Errorf("body bytes held %d, want the others' %d", got, 10*mib)
		}
	})
	t.Run("an unannounced body reserves its buffer as it grows", func(t *testing.T) {
		st, _ := budgetStream(64*mib, 0, pickOne)
		headers(t, st, -1)
		chunk(t, st, 1000, false)
		chunk(t, st, 1000, false)
		if got, c := st.s.HeldBodyBytes(), cap(st.req.Body); got != int64(c) || c != 2000 {
			t.Errorf("held %d capacity %d, want both 2000", got, c)
		}
	})
	t.Run("growth takes the room left near the limit, then refuses without a copy per chunk", func(t *testing.T) {
		st, out := budgetStream(3500, 0, pickOne)
		headers(t, st, -1)
		room := 3500 - st.s.HeldHeaderBytes()
		chunk(t, st, 2000, false)
		chunk(t, st, 1000, false) // doubling would take 4000
		if got, c := st.s.HeldBodyBytes(), cap(st.req.Body); got != room || int64(c) != room {
			t.Errorf("held %d capacity %d, want both the room left, %d", got, c, room)
		}
		chunk(t, st, int(room)-3000, false) // fills the buffer, no growth
		if len(out.sent) != 0 || int64(cap(st.req.Body)) != room {
			t.Fatalf("filling the room: %d answers, capacity %d; want none and %d", len(out.sent), cap(st.req.Body), room)
		}
		if !chunk(t, st, 1, false) {
			t.Error("one byte past the budget went in, want 429")
		}
	})
	t.Run("a body that outgrows the budget is refused mid-body", func(t *testing.T) {
		st, out := budgetStream(3500, 0, pickOne)
		headers(t, st, -1)
		hdr := st.s.HeldHeaderBytes()
		chunk(t, st, 3000, false)
		if !chunk(t, st, 1000, false) {
			t.Fatal("stream goes on, want it answered")
		}
		want := heldBytesDetails{LimitKind: "held_bytes", Current: 3000 + hdr, Limit: 3500, Requested: 1000}
		if got := heldAnswer(t, out); got != want {
			t.Errorf("details %+v, want %+v", got, want)
		}
		if st.s.HeldBodyBytes() != 0 || st.req.Body != nil {
			t.Errorf("held %d, body %d bytes after the answer; want both let go", st.s.HeldBodyBytes(), len(st.req.Body))
		}
	})
	t.Run("more bytes than announced reserve the rest", func(t *testing.T) {
		st, _ := budgetStream(64*mib, 0, pickOne)
		headers(t, st, 1000)
		chunk(t, st, 1000, false)
		chunk(t, st, 500, false)
		if got := st.s.HeldBodyBytes(); got < 1500 || got != int64(cap(st.req.Body)) {
			t.Errorf("held %d capacity %d, want the capacity held, at least 1500", got, cap(st.req.Body))
		}
	})
	t.Run("released once passed back", func(t *testing.T) {
		var heldWhileDeciding int64
		var st *stream
		st, out := budgetStream(64*mib, 0, decideFunc(func(context.Context, *Request) (Decision, error) {
			heldWhileDeciding = st.s.HeldBodyBytes()
			return Decision{Endpoints: []string{"10.0.0.1:8000"}}, nil
		}))
		headers(t, st, 200_000)
		chunk(t, st, 100_000, false)
		chunk(t, st, 100_000, true)
		if heldWhileDeciding != 200_000 {
			t.Errorf("held while deciding %d, want 200000", heldWhileDeciding)
		}
		if st.s.HeldBodyBytes() != 0 || st.req.Body != nil {
			t.Errorf("held %d, body %d bytes after streaming it back; want both let go", st.s.HeldBodyBytes(), len(st.req.Body))
		}
		if n := len(out.sent); n != 1+(200_000+MaxChunkBytes-1)/MaxChunkBytes {
			t.Errorf("%d messages sent, want the pick and the body's chunks", n)
		}
	})
	t.Run("a replacement body is held whatever the budget", func(t *testing.T) {
		var heldAfter []int64
		var st *stream
		st, out := budgetStream(1000, 0, decideFunc(func(context.Context, *Request) (Decision, error) {
			return Decision{Endpoints: []string{"10.0.0.1:8000"}, Body: make([]byte, 5000)}, nil
		}))
		st.srv = &recordingSink{sink: out, on: func() { heldAfter = append(heldAfter, st.s.HeldBodyBytes()) }}
		headers(t, st, 500)
		chunk(t, st, 500, true)
		if len(heldAfter) == 0 || heldAfter[0] != 5000 {
			t.Errorf("held when the pick went out %v, want the replacement's 5000", heldAfter)
		}
		if st.s.HeldBodyBytes() != 0 {
			t.Errorf("held %d after streaming it back, want 0", st.s.HeldBodyBytes())
		}
	})
	t.Run("BUFFERED: held from the body message, released with the answer", func(t *testing.T) {
		var heldWhileDeciding int64
		var st *stream
		st, out := budgetStream(64*mib, 0, decideFunc(func(context.Context, *Request) (Decision, error) {
			heldWhileDeciding = st.s.HeldBodyBytes()
			return Decision{Endpoints: []string{"10.0.0.1:8000"}}, nil
		}))
		st.reqMode = filterv3.ProcessingMode_BUFFERED
		headers(t, st, 3000)
		chunk(t, st, 3000, true)
		if heldWhileDeciding != 3000 || st.s.HeldBodyBytes() != 0 || len(out.sent) != 2 {
			t.Errorf("held while deciding %d, after %d, %d messages; want 3000, 0 and 2", heldWhileDeciding, st.s.HeldBodyBytes(), len(out.sent))
		}
	})
	t.Run("released when the gateway goes away mid-body", func(t *testing.T) {
		s := NewServer(pickOne, Options{MaxHeldBodyBytes: 64 * mib})
		hs := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: "content-length", RawValue: []byte("5000")}}}
		in := &script{msgs: []*extprocv3.ProcessingRequest{
			{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hs}}},
			{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: make([]byte, 1000)}}},
		}, s: s}
		if err := s.Process(in); err != nil {
			t.Fatalf("Process: %v", err)
		}
		if in.heldAtEnd != 5000 || s.HeldBodyBytes() != 0 || s.HeldHeaderBytes() != 0 {
			t.Errorf("held %d when the gateway left, %d after (headers %d); want 5000 and 0 (0)", in.heldAtEnd, s.HeldBodyBytes(), s.HeldHeaderBytes())
		}
	})
}

// script plays a fixed list of messages, then the gateway's cancellation,
// noting the budget's bytes then.
type script struct {
	sink
	msgs      []*extprocv3.ProcessingRequest
	s         *Server
	heldAtEnd int64
	onEnd     func() // when set, called instead of noting the body bytes
}

func (sc *script) Recv() (*extprocv3.ProcessingRequest, error) {
	if len(sc.msgs) == 0 {
		if sc.onEnd != nil {
			sc.onEnd()
		} else {
			sc.heldAtEnd = sc.s.HeldBodyBytes()
		}
		return nil, status.Error(codes.Canceled, "gateway went away")
	}
	m := sc.msgs[0]
	sc.msgs = sc.msgs[1:]
	return m, nil
}

// recordingSink calls on before keeping each message.
type recordingSink struct {
	*sink
	on func()
}

func (r *recordingSink) Send(m *extprocv3.ProcessingResponse) error {
	r.on()
	return r.sink.Send(m)
}
