package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/pkg/extproc"
)

// paddedBody is a valid completions body of exactly n bytes: a short
// prompt and a padding field the parser skips, so the test measures the
// bytes the picker holds, not its tokenizer.
func paddedBody(n int) []byte {
	head := `{"model":"test-model","prompt":"hi","max_tokens":1,"x_pad":"`
	tail := `"}`
	b := make([]byte, 0, n)
	b = append(b, head...)
	b = append(b, bytes.Repeat([]byte{'a'}, n-len(head)-len(tail))...)
	return append(b, tail...)
}

// vmKB reads a field of /proc/<pid>/status in kB (VmRSS, VmHWM).
func vmKB(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read status of pid %d: %v", pid, err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("%s %q: %v", field, v, err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// trickler plays one slow client's FULL_DUPLEX_STREAMED request on a raw
// ext_proc stream: headers announcing the whole body, then the body in
// small chunks, paced, until the body ends or the picker answers.
type trickler struct {
	s      extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
	resp   chan *extprocv3.ProcessingResponse // every message the picker sends; closed at the stream's end
	end    error                              // why the stream ended, read after resp closes
}

func startTrickler(ctx context.Context, t *testing.T, client extprocv3.ExternalProcessorClient, body []byte, pin string) *trickler {
	t.Helper()
	sctx, cancel := context.WithCancel(ctx)
	s, err := client.Process(sctx)
	if err != nil {
		cancel()
		t.Errorf("open stream: %v", err)
		return nil
	}
	tr := &trickler{s: s, cancel: cancel, resp: make(chan *extprocv3.ProcessingResponse, 512)}
	go func() {
		defer close(tr.resp)
		for {
			m, err := s.Recv()
			if err != nil {
				tr.end = err
				return
			}
			tr.resp <- m
		}
	}()
	hs := extprocclient.AppendHeaders([]*corev3.HeaderValue{
		{Key: ":authority", RawValue: []byte("localhost")},
		{Key: ":path", RawValue: []byte("/v1/completions")},
		{Key: ":method", RawValue: []byte("POST")},
	}, http.Header{"content-type": {"application/json"}, "content-length": {strconv.Itoa(len(body))}})
	err = s.Send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{
			RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			extproc.MetadataNamespaceSubset: {Fields: map[string]*structpb.Value{extproc.MetadataKeySubset: structpb.NewStringValue(pin)}},
		}},
	})
	if err != nil {
		t.Errorf("send headers: %v", err)
	}
	return tr
}

// send sends one body chunk; false when the picker ended the stream.
func (tr *trickler) send(chunk []byte, eos bool) bool {
	err := tr.s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: chunk, EndOfStream: eos},
	}})
	return err == nil
}

// heldDetails is the details object of a 429 held_bytes answer.
type heldDetails struct {
	LimitKind string `json:"limit_kind"`
	Current   int64  `json:"current"`
	Limit     int64  `json:"limit"`
	Requested int64  `json:"requested"`
}

// TestHeldBodyBudget: dozens of clients each sending a 15 MB body, on top
// of queued 1 MB bodies, cannot make the picker hold more than
// --max-held-body-bytes (here derived: half of GOMEMLIMIT): a body is held
// as it arrives, and one whose next bytes would pass the budget gets 429
// held_bytes with the numbers; the bodies that fit are served whole;
// every stream gets exactly one answer; small requests are routed or told
// held_bytes, never left waiting; a body is let go once passed back to
// the gateway; and the picker's resident memory stays under the budget
// plus a stated overhead.
func TestHeldBodyBudget(t *testing.T) {
	const (
		memLimit   = 160 << 20
		budget     = memLimit / 2 // the derived --max-held-body-bytes
		queuedN    = 8
		queuedSize = 1_000_000
		bigN       = 40 // 600 MB of bodies at once, 7.5 budgets
		bigSize    = 15_000_000
		chunk      = 64 << 10
		// overhead is what the picker may hold beyond the budget. The
		// budget is half of GOMEMLIMIT; the runtime lets the heap grow to
		// the limit before it collects, so the other half fills with the
		// garbage of the bodies' traffic (every received chunk is a fresh
		// message, every growth step a copy) and everything else on the
		// heap. Beyond GOMEMLIMIT the resident set has the binary's text
		// and data, the runtime's own structures and freed pages not yet
		// returned: 36-41 MiB at start with a 4 MiB heap, so 48 MiB.
		// Measured peak: 183-191 MiB.
		overhead = memLimit - budget + 48<<20
	)
	launch.CheckGoroutines(t)
	bs := startBackends(t, 2)
	a, b := bs[0].addr, bs[1].addr
	env := append(os.Environ(), "GOMEMLIMIT="+strconv.Itoa(memLimit))
	p := startEPP(t, launch.EPPOptions{Endpoints: addrs(bs), Policy: writePolicy(t, `
policy_classes:
  - {name: standard, queue_policy: fcfs, quantum: 1, prefill_busy_threshold: 100}
`), Proc: launch.ProcOptions{Env: env}})
	pid := p.Cmd.Process.Pid
	rssStart := vmKB(t, pid, "VmRSS")
	c := p.Client(t, extprocclient.Options{})
	ctx := testCtx(t)

	if got := p.Metrics.Value(t, "laneway_held_body_bytes_limit"); got != budget {
		t.Fatalf("laneway_held_body_bytes_limit = %v, want half of GOMEMLIMIT, %d", got, budget)
	}

	// A busy, and queuedN 1 MB bodies queued for it.
	holder := mustStart(t, c, pinned(spec(tokens(500, 0)), a))
	mustRoute(t, holder)
	queuedBody := paddedBody(queuedSize)
	queued := make(chan started, queuedN)
	for i := range queuedN {
		startInto(ctx, c, "queued", pinned(spec(queuedBody), a), queued)
		p.Metrics.Await(t, float64(i+1), "dynamo_frontend_router_queue_pending_requests", "policy_class", "standard")
	}
	p.Metrics.Await(t, queuedN*queuedSize, "laneway_held_body_bytes")

	// The storm: bigN clients, each sending bigSize. Before the budget
	// existed every one was taken in; the guard stops the test before it
	// takes this machine's memory.
	bigBody := paddedBody(bigSize)
	conn := p.Conn(t)
	client := extprocv3.NewExternalProcessorClient(conn)
	var (
		rejected, admitted, routedBig atomic.Int64
		unanswered                    atomic.Int64 // bytes sent by streams with no answer yet
		wg                            sync.WaitGroup
		mu                            sync.Mutex
		details                       []heldDetails
	)
	guard := int64(2 * budget)
	for range bigN {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr := startTrickler(ctx, t, client, bigBody, b)
			if tr == nil {
				return
			}
			defer tr.cancel()
			sent := 0
			answered := false
			var first *extprocv3.ProcessingResponse
			for sent < len(bigBody) && !answered {
				select {
				case m, ok := <-tr.resp:
					answered, first = true, m
					if !ok {
						t.Errorf("stream ended without an answer after %d bytes: %v", sent, tr.end)
						return
					}
					continue
				default:
				}
				end := min(sent+chunk, len(bigBody))
				if !tr.send(bigBody[sent:end], end == len(bigBody)) {
					break // the picker answered and ended the stream
				}
				unanswered.Add(int64(end - sent))
				if unanswered.Load() > guard {
					t.Errorf("the picker holds over %d body bytes without answering: no budget", guard)
					return
				}
				sent = end
				time.Sleep(2 * time.Millisecond) // a slow client
			}
			if first == nil {
				m, ok := <-tr.resp
				if !ok {
					t.Errorf("stream ended without an answer after %d bytes: %v", sent, tr.end)
					return
				}
				first = m
			}
			unanswered.Add(-int64(sent))
			if ir := first.GetImmediateResponse(); ir != nil {
				rejected.Add(1)
				var body struct{ Details heldDetails }
				if int(ir.GetStatus().GetCode()) != http.StatusTooManyRequests || json.Unmarshal(ir.GetBody(), &body) != nil {
					t.Errorf("immediate response %v %s, want 429 held_bytes", ir.GetStatus(), ir.GetBody())
					return
				}
				mu.Lock()
				details = append(details, body.Details)
				mu.Unlock()
				if m, ok := <-tr.resp; ok {
					t.Errorf("a second message after the 429: %v", m)
				}
				return
			}
			// Admitted: the pick, then the whole body streamed back.
			admitted.Add(1)
			if first.GetRequestHeaders() == nil {
				t.Errorf("first answer %T, want the request headers' pick", first.GetResponse())
				return
			}
			var back bytes.Buffer
			for {
				m, ok := <-tr.resp
				if !ok {
					t.Errorf("stream ended after %d of %d body bytes streamed back: %v", back.Len(), len(bigBody), tr.end)
					return
				}
				sb := m.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
				if sb == nil {
					t.Errorf("message %T while the body streams back", m.GetResponse())
					return
				}
				back.Write(sb.GetBody())
				if sb.GetEndOfStream() {
					break
				}
			}
			if !bytes.Equal(back.Bytes(), bigBody) {
				t.Errorf("body streamed back: %d bytes, differs from the %d sent", back.Len(), len(bigBody))
			}
			routedBig.Add(1)
			// The body went back to the gateway: the picker no longer holds it.
			_ = tr.s.CloseSend()
		}()
	}

	// Small requests are answered while the storm goes on: routed, or
	// told that the budget is full right now.
	smallRefused := 0
	for i := range 20 {
		ex := mustStart(t, c, pinned(spec(tokens(16, 100+i)), b))
		if d := ex.Decision(); !d.Routed() {
			immediate(t, ex, http.StatusTooManyRequests, "held_bytes")
			smallRefused++
			continue
		}
		completeStream(t, ex)
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if got := admitted.Load(); got < 1 || got+rejected.Load() != bigN || routedBig.Load() != got {
		t.Errorf("admitted %d (routed whole %d), rejected %d; want at least one admitted, and %d in all",
			got, routedBig.Load(), rejected.Load(), bigN)
	}
	t.Logf("%d of %d 15 MB bodies admitted, %d refused mid-body", admitted.Load(), bigN, rejected.Load())
	for _, d := range details {
		if d.LimitKind != "held_bytes" || d.Limit != budget || d.Requested <= 0 || d.Current+d.Requested <= d.Limit {
			t.Errorf("429 details %+v, want limit_kind held_bytes, limit %d, current+requested over the limit", d, budget)
			break
		}
	}
	// Small requests are routed once the storm is over.
	for i := range 5 {
		ex := mustStart(t, c, pinned(spec(tokens(16, 200+i)), b))
		mustRoute(t, ex)
		completeStream(t, ex)
	}
	// The admitted bodies were let go once passed back; the queued ones
	// are still held.
	p.Metrics.Await(t, queuedN*queuedSize, "laneway_held_body_bytes")

	completeStream(t, holder)
	for range queuedN {
		s := await(t, queued)
		if got := mustRoute(t, s.ex); got != a {
			t.Errorf("queued request routed to %s, want %s", got, a)
		}
		if d := s.ex.Decision(); !bytes.Equal(d.Body, queuedBody) {
			t.Errorf("queued body streamed back: %d bytes, want the %d sent", len(d.Body), len(queuedBody))
		}
		completeStream(t, s.ex)
	}
	p.Metrics.Await(t, 0, "laneway_held_body_bytes")
	p.Metrics.Await(t, float64(rejected.Load())+float64(smallRefused), "laneway_extproc_streams_total", "outcome", "held_bytes")

	peak := vmKB(t, pid, "VmHWM") << 10
	t.Logf("picker RSS: %d MiB at start, peak %d MiB; budget %d MiB + overhead %d MiB", rssStart>>10, peak>>20, budget>>20, overhead>>20)
	if launch.RaceFromEnv() {
		t.Log("race detector build: its shadow memory makes RSS no measure of the budget; not checked")
		return
	}
	if peak > budget+overhead {
		t.Errorf("picker peak RSS %d MiB, over the budget %d MiB + overhead %d MiB", peak>>20, budget>>20, overhead>>20)
	}
}
