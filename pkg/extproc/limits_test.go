package extproc

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// lastImmediate returns the status, reason and JSON body of the last
// message sent, which must be an immediate response.
func lastImmediate(t *testing.T, sent []*extprocv3.ProcessingResponse) (int, string, []byte) {
	t.Helper()
	if len(sent) == 0 {
		t.Fatal("nothing sent, want an immediate response")
	}
	ir := sent[len(sent)-1].GetImmediateResponse()
	if ir == nil {
		t.Fatalf("last message %v, want an immediate response", sent[len(sent)-1])
	}
	var reason string
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == HeaderReason {
			reason = string(h.GetHeader().GetRawValue())
		}
	}
	return int(ir.GetStatus().GetCode()), reason, ir.GetBody()
}

// headersOf plays request headers with a padding header of pad bytes.
func headersOf(t *testing.T, st *stream, pad int) bool {
	t.Helper()
	hs := []*corev3.HeaderValue{
		{Key: ":path", RawValue: []byte("/")},
		{Key: "content-length", RawValue: []byte("100")},
		{Key: "x-pad", RawValue: []byte(strings.Repeat("a", pad))},
	}
	end, err := st.onRequestHeaders(&extprocv3.ProcessingRequest{}, &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}})
	if err != nil {
		t.Fatalf("headers: %v", err)
	}
	return end
}

// TestHeaderLimits: a request's header block is bounded by MaxHeaderBytes
// (431, nothing kept) and counted against the held-bytes budget while the
// stream is open (429 held_bytes when it does not fit).
func TestHeaderLimits(t *testing.T) {
	// The block's size: names and values of :path, content-length, x-pad.
	size := func(pad int) int64 { return int64(len(":path/content-length100x-pad") + pad) }

	t.Run("over MaxHeaderBytes: 431 naming the limit, nothing kept", func(t *testing.T) {
		st, out := budgetStream(64<<20, 0, pickOne)
		if !headersOf(t, st, DefaultMaxHeaderBytes) {
			t.Fatal("stream goes on, want it answered")
		}
		code, reason, body := lastImmediate(t, out.sent)
		var b struct {
			Error   string
			Details limitDetails
		}
		if err := json.Unmarshal(body, &b); err != nil || code != 431 || reason != OutcomeHeadersTooLarge {
			t.Fatalf("answer %d %q %s, want 431 %s", code, reason, body, OutcomeHeadersTooLarge)
		}
		want := limitDetails{LimitKind: "header_bytes", Limit: DefaultMaxHeaderBytes, Requested: size(DefaultMaxHeaderBytes)}
		if b.Details != want || !strings.Contains(b.Error, "65536") {
			t.Errorf("details %+v (%q), want %+v and the limit in the message", b.Details, b.Error, want)
		}
		if st.outcome != OutcomeHeadersTooLarge || st.s.HeldHeaderBytes() != 0 || st.req.Headers != nil {
			t.Errorf("outcome %q, header bytes held %d, headers kept %v; want %q, 0, none", st.outcome, st.s.HeldHeaderBytes(), st.req.Headers != nil, OutcomeHeadersTooLarge)
		}
	})
	t.Run("held while the stream is open, with the bodies", func(t *testing.T) {
		s := NewServer(pickOne, Options{})
		sc := &script{s: s, msgs: []*extprocv3.ProcessingRequest{{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				{Key: ":path", RawValue: []byte("/")},
				{Key: "content-length", RawValue: []byte("100")},
				{Key: "x-pad", RawValue: []byte(strings.Repeat("a", 5000))},
			}},
		}}}}}
		sc.onEnd = func() { sc.heldAtEnd = s.HeldHeaderBytes() }
		if err := s.Process(sc); err != nil {
			t.Fatalf("Process: %v", err)
		}
		if sc.heldAtEnd != size(5000) || s.HeldHeaderBytes() != 0 || s.HeldBodyBytes() != 0 {
			t.Errorf("header bytes held %d while open, %d after (body %d); want %d, 0, 0", sc.heldAtEnd, s.HeldHeaderBytes(), s.HeldBodyBytes(), size(5000))
		}
	})
	t.Run("a block the budget cannot take: 429 held_bytes", func(t *testing.T) {
		st, out := budgetStream(10_000, 8_000, pickOne)
		if !headersOf(t, st, 5000) {
			t.Fatal("stream goes on, want it answered")
		}
		want := heldBytesDetails{LimitKind: "held_bytes", Current: 8000, Limit: 10_000, Requested: size(5000)}
		if got := heldAnswer(t, out); got != want {
			t.Errorf("details %+v, want %+v", got, want)
		}
		if st.s.HeldHeaderBytes() != 0 {
			t.Errorf("header bytes held %d, want 0", st.s.HeldHeaderBytes())
		}
	})
}

// TestBodyTimeout: a body that has not arrived by the deadline is
// answered 408 body_timeout once, with the limit and the bytes, and lets
// go of everything it held; a body that completes first stops the clock.
// The deadline is fired by hand: the timer's duration is not the subject.
func TestBodyTimeout(t *testing.T) {
	t.Run("stalled after one byte", func(t *testing.T) {
		st, out := budgetStream(64<<20, 0, pickOne)
		headers(t, st, 16<<20)
		chunk(t, st, 1, false)
		c := st.clock
		if c == nil {
			t.Fatal("no body clock after the headers")
		}
		c.expire()
		code, reason, body := lastImmediate(t, out.sent)
		var b struct {
			Error   string
			Details bodyTimeoutDetails
		}
		if err := json.Unmarshal(body, &b); err != nil || code != 408 || reason != OutcomeBodyTimeout {
			t.Fatalf("answer %d %q %s, want 408 %s", code, reason, body, OutcomeBodyTimeout)
		}
		want := bodyTimeoutDetails{LimitKind: "body_timeout", LimitSeconds: 60, ReceivedBytes: 1, AnnouncedBytes: 16 << 20}
		if b.Details != want || !strings.Contains(b.Error, "body timeout of 1m0s") {
			t.Errorf("details %+v (%q), want %+v and the limit in the message", b.Details, b.Error, want)
		}
		if st.s.HeldBodyBytes() != 0 || st.s.HeldHeaderBytes() != 0 || st.outcome != OutcomeBodyTimeout {
			t.Errorf("held body %d headers %d, outcome %q; want 0, 0, %q", st.s.HeldBodyBytes(), st.s.HeldHeaderBytes(), st.outcome, OutcomeBodyTimeout)
		}
		// A chunk already on its way ends the stream without a second answer.
		if !chunk(t, st, 10, true) || len(out.sent) != 1 {
			t.Errorf("after the deadline a chunk left the stream going, or was answered: %d messages", len(out.sent))
		}
		c.expire() // a second expiry is no answer either
		if len(out.sent) != 1 {
			t.Errorf("%d messages after a second expiry, want the one answer", len(out.sent))
		}
	})
	t.Run("the body completes first", func(t *testing.T) {
		st, out := budgetStream(64<<20, 0, pickOne)
		headers(t, st, 10)
		c := st.clock
		chunk(t, st, 10, true)
		if st.clock != nil || c.st != nil {
			t.Fatal("clock still running after the body's end")
		}
		c.expire() // a timer that fired anyway finds nothing to do
		if len(out.sent) != 2 || out.sent[1].GetRequestBody() == nil {
			t.Errorf("sent %v, want the pick and the body only", out.sent)
		}
	})
	t.Run("off with a negative timeout", func(t *testing.T) {
		s := NewServer(pickOne, Options{BodyTimeout: -1})
		st := &stream{s: s, srv: &sink{}, ctx: context.Background(), started: true, reqMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
		headers(t, st, 10)
		if st.clock != nil {
			t.Error("a body clock with the timeout off")
		}
	})
}

// TestBodyTimeoutWhileInRecv: the deadline's timer answers a stream whose
// goroutine waits in Recv for the rest of the body, and gives back what it
// held before the gateway ends the stream.
func TestBodyTimeoutWhileInRecv(t *testing.T) {
	srv := NewServer(pickOne, Options{BodyTimeout: 50 * time.Millisecond})
	in := make(chan *extprocv3.ProcessingRequest, 2)
	out := &chanSink{in: in, sent: make(chan *extprocv3.ProcessingResponse, 4)}
	in <- &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: "content-length", RawValue: []byte("1000")}}},
	}}}
	in <- &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte("{")}}}
	done := make(chan error, 1)
	go func() { done <- srv.Process(out) }()
	select {
	case m := <-out.sent:
		if got := m.GetImmediateResponse().GetStatus().GetCode(); got != 408 {
			t.Fatalf("answer %v, want 408", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no answer within 10s of a 50ms body timeout")
	}
	if srv.HeldBodyBytes() != 0 || srv.HeldHeaderBytes() != 0 {
		t.Errorf("held body %d headers %d after the answer, want 0 and 0", srv.HeldBodyBytes(), srv.HeldHeaderBytes())
	}
	close(in) // the gateway ends the stream
	if err := <-done; err != nil {
		t.Errorf("Process: %v", err)
	}
}

// chanSink is a stream whose gateway side is a channel of messages (Recv
// blocks on it; closed: the gateway ended the stream) and whose answers go
// to a channel.
type chanSink struct {
	sink
	in   chan *extprocv3.ProcessingRequest
	sent chan *extprocv3.ProcessingResponse
}

func (c *chanSink) Recv() (*extprocv3.ProcessingRequest, error) {
	m, ok := <-c.in
	if !ok {
		return nil, io.EOF
	}
	return m, nil
}

func (c *chanSink) Send(m *extprocv3.ProcessingResponse) error { c.sent <- m; return nil }

// TestStreamLimit: past MaxStreams open streams, one more is answered 429
// stream_limit at its first message, naming the numbers, and the streams
// already open are not touched.
func TestStreamLimit(t *testing.T) {
	deciding := make(chan struct{})
	block := decideFunc(func(ctx context.Context, _ *Request) (Decision, error) {
		close(deciding)
		<-ctx.Done()
		return Decision{}, ctx.Err()
	})
	srv := NewServer(block, Options{MaxStreams: 1})
	ctx, cancel := context.WithCancel(context.Background())
	first := &ctxSink{chanSink: chanSink{in: make(chan *extprocv3.ProcessingRequest, 1), sent: make(chan *extprocv3.ProcessingResponse, 1)}, ctx: ctx}
	first.in <- &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{EndOfStream: true}}}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = srv.Process(first) }()
	<-deciding
	if got := srv.OpenStreams(); got != 1 {
		t.Fatalf("open streams %d, want 1", got)
	}

	second := &sink{}
	sc := &script{sink: *second, s: srv, msgs: []*extprocv3.ProcessingRequest{{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{EndOfStream: true}}}}}
	if err := srv.Process(sc); err != nil {
		t.Fatalf("Process: %v", err)
	}
	code, reason, body := lastImmediate(t, sc.sent)
	var b struct{ Details limitDetails }
	if err := json.Unmarshal(body, &b); err != nil || code != 429 || reason != OutcomeStreamLimit || len(sc.sent) != 1 {
		t.Fatalf("answers %v, want one 429 %s", sc.sent, OutcomeStreamLimit)
	}
	if want := (limitDetails{LimitKind: "streams", Current: 1, Limit: 1}); b.Details != want {
		t.Errorf("details %+v, want %+v", b.Details, want)
	}
	cancel()
	close(first.in)
	wg.Wait()
	if got := srv.OpenStreams(); got != 0 {
		t.Errorf("open streams %d after both ended, want 0", got)
	}
}

// ctxSink is a chanSink with a context of its own.
type ctxSink struct {
	chanSink
	ctx context.Context
}

func (c *ctxSink) Context() context.Context { return c.ctx }
