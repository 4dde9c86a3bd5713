package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

// Probes of a picker that one unauthenticated client tries to deny to
// everyone else (issue 22): streams that announce large bodies and stall,
// and streams with huge header blocks. Each runs against the real binary
// under a GOMEMLIMIT, routes normal requests while the abuse goes on, and
// checks that every abusive stream gets exactly one answer and that the
// picker's peak RSS stays under the limit. They log the peak RSS and the
// normal requests' decision latencies, the figures the issue asks for.

// rawStream is one abusive client's ext_proc stream: it sends what the
// probe tells it to and collects every message the picker sends.
type rawStream struct {
	s      extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
	resp   chan *extprocv3.ProcessingResponse // closed when the stream ends
}

// openRaw opens a FULL_DUPLEX_STREAMED stream and sends request headers
// with content-length announce (none when < 0) and the extra headers. The
// stream is cancelled at ctx's end.
func openRaw(ctx context.Context, client extprocv3.ExternalProcessorClient, announce int, extra http.Header) (*rawStream, error) {
	sctx, cancel := context.WithCancel(ctx)
	s, err := client.Process(sctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("open stream: %w", err)
	}
	rs := &rawStream{s: s, cancel: cancel, resp: make(chan *extprocv3.ProcessingResponse, 16)}
	go func() {
		defer close(rs.resp)
		for {
			m, err := s.Recv()
			if err != nil {
				return
			}
			rs.resp <- m
		}
	}()
	h := http.Header{"content-type": {"application/json"}}
	if announce >= 0 {
		h.Set("content-length", strconv.Itoa(announce))
	}
	for k, v := range extra {
		h[k] = v
	}
	hs := extprocclient.AppendHeaders([]*corev3.HeaderValue{
		{Key: ":authority", RawValue: []byte("localhost")},
		{Key: ":path", RawValue: []byte("/v1/completions")},
		{Key: ":method", RawValue: []byte("POST")},
	}, h)
	err = s.Send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{
			RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		},
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("send headers: %w", err)
	}
	return rs, nil
}

// answer waits for the stream's first message, which must be an immediate
// response, and then for the end of the stream with no second message:
// exactly one answer. It returns the status, the reason and the body.
func (rs *rawStream) answer(within time.Duration) (int, string, []byte, error) {
	defer rs.cancel()
	var m *extprocv3.ProcessingResponse
	select {
	case m = <-rs.resp:
	case <-time.After(within):
		return 0, "", nil, fmt.Errorf("no answer within %s", within)
	}
	ir := m.GetImmediateResponse()
	if ir == nil {
		return 0, "", nil, fmt.Errorf("answer %T, want an immediate response", m.GetResponse())
	}
	var reason string
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == "x-laneway-reason" {
			reason = string(h.GetHeader().GetRawValue())
		}
	}
	// The picker ends its side after an immediate response; the gateway
	// ends the stream as Envoy does.
	_ = rs.s.CloseSend()
	select {
	case m2, ok := <-rs.resp:
		if ok {
			return 0, "", nil, fmt.Errorf("a second message after the answer: %v", m2)
		}
	case <-time.After(launch.EventTimeout):
		return 0, "", nil, errors.New("the stream did not end after its answer")
	}
	return int(ir.GetStatus().GetCode()), reason, ir.GetBody(), nil
}

// routeNormal sends n small requests one after another while an abuse
// goes on, requires each routed, plays its response, and returns the
// decision latencies.
func routeNormal(t *testing.T, c *extprocclient.Client, n int) []time.Duration {
	t.Helper()
	lat := make([]time.Duration, 0, n)
	for i := range n {
		ex := mustStart(t, c, spec(tokens(64, 1000+i)))
		mustRoute(t, ex)
		lat = append(lat, ex.Decision().Latency)
		completeStream(t, ex)
	}
	return lat
}

// latencySummary is "p50 X, max Y" of latencies.
func latencySummary(lat []time.Duration) string {
	s := slices.Clone(lat)
	slices.Sort(s)
	return "p50 " + s[len(s)/2].String() + ", max " + s[len(s)-1].String()
}

// checkPeakRSS logs the picker's peak RSS and fails when it reached the
// GOMEMLIMIT it runs under (not with the race detector, whose shadow
// memory is no measure of the picker's).
func checkPeakRSS(t *testing.T, p *launch.EPP, memLimit int64, what string) {
	t.Helper()
	peak := vmKB(t, p.Cmd.Process.Pid, "VmHWM") << 10
	t.Logf("%s: picker peak RSS %d MiB (GOMEMLIMIT %d MiB)", what, peak>>20, memLimit>>20)
	if launch.RaceFromEnv() {
		return
	}
	if peak >= memLimit {
		t.Errorf("%s: picker peak RSS %d MiB, not under GOMEMLIMIT %d MiB", what, peak>>20, memLimit>>20)
	}
}

// startAbusePicker runs the picker under GOMEMLIMIT memLimit with one
// backend and the given further flags.
func startAbusePicker(t *testing.T, memLimit int64, args ...string) (*launch.EPP, *extprocclient.Client) {
	t.Helper()
	launch.CheckGoroutines(t)
	bs := startBackends(t, 1)
	env := append(os.Environ(), "GOMEMLIMIT="+strconv.FormatInt(memLimit, 10))
	p := startEPP(t, launch.EPPOptions{Endpoints: addrs(bs), Args: args, Proc: launch.ProcOptions{Env: env}})
	return p, p.Client(t, extprocclient.Options{})
}

// TestBodySquatters: 40 clients each announce a 16 MiB body, send one
// byte and stall. They hold only what arrived (the first buffer, at most
// 64 KiB), so requests with bodies keep being routed; each squatter is
// answered 408 body_timeout once --body-timeout passes, naming the
// limit, and its bytes go back to the budget.
func TestBodySquatters(t *testing.T) {
	const (
		// The held-body budget is half of it, 128 MiB: eight squatters
		// would fill it if announced bytes were reserved.
		memLimit  = 256 << 20
		squatters = 40
		announced = 16 << 20
		slice     = 64 << 10 // the first buffer of a body announced larger
		timeout   = 3 * time.Second
	)
	p, c := startAbusePicker(t, memLimit, "--body-timeout="+timeout.String())
	client := extprocv3.NewExternalProcessorClient(p.Conn(t))
	ctx := testCtx(t)

	streams := make([]*rawStream, squatters)
	for i := range streams {
		var err error
		if streams[i], err = openRaw(ctx, client, announced, nil); err != nil {
			t.Fatalf("squatter %d: %v", i, err)
		}
		if err := streams[i].s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: []byte("{")},
		}}); err != nil {
			t.Fatalf("squatter %d: send its byte: %v", i, err)
		}
	}
	started := time.Now()
	p.Metrics.Await(t, squatters*slice, "laneway_held_body_bytes")

	lat := routeNormal(t, c, 20)
	t.Logf("decision latency of 20 requests among %d squatters: %s", squatters, latencySummary(lat))
	if elapsed := time.Since(started); elapsed >= timeout {
		t.Fatalf("the normal requests took %s, past the squatters' deadline of %s: the probe proves nothing; raise the timeout", elapsed, timeout)
	}

	for i, rs := range streams {
		st, reason, body, err := rs.answer(timeout + launch.EventTimeout)
		if err != nil {
			t.Fatalf("squatter %d: %v", i, err)
		}
		var b struct {
			Error   string
			Details struct {
				LimitKind      string  `json:"limit_kind"`
				LimitSeconds   float64 `json:"limit_seconds"`
				ReceivedBytes  int64   `json:"received_bytes"`
				AnnouncedBytes int64   `json:"announced_bytes"`
			}
		}
		if st != http.StatusRequestTimeout || reason != "body_timeout" || json.Unmarshal(body, &b) != nil {
			t.Fatalf("squatter %d answered %d %q %s, want 408 body_timeout", i, st, reason, body)
		}
		d := b.Details
		if d.LimitKind != "body_timeout" || d.LimitSeconds != timeout.Seconds() || d.ReceivedBytes != 1 || d.AnnouncedBytes != announced ||
			!strings.Contains(b.Error, "body timeout of "+timeout.String()) {
			t.Fatalf("squatter %d: 408 body %s, want the limit (%s), the bytes received (1) and announced (%d)", i, body, timeout, announced)
		}
	}
	if waited := time.Since(started); waited < timeout {
		t.Errorf("squatters answered after %s, before their deadline of %s", waited, timeout)
	}
	p.Metrics.Await(t, 0, "laneway_held_body_bytes")
	p.Metrics.Await(t, squatters, "laneway_extproc_streams_total", "outcome", "body_timeout")
	checkPeakRSS(t, p, memLimit, "40 body squatters")
}

// TestHeaderFlood: 20 clients each send a request whose headers carry 4
// MiB (one padding header) and then stall. Each is answered 431
// headers_too_large at once, naming the limit (--max-header-bytes, 64 KiB),
// and nothing of it is kept, while small requests keep being routed.
//
// What the picker cannot avoid is gRPC's own copy: a message is received
// whole, and decoded, before the handler sees it, so each 4 MiB block
// arriving costs two to three times its size until it is answered
// (measured: a live heap of about 150 MiB while the 20 arrive at once).
// The limit keeps none of it past its answer; a gateway's own header
// limit (Envoy: 60 KiB by default) keeps such blocks from the picker in
// the first place.
func TestHeaderFlood(t *testing.T) {
	const (
		memLimit = 512 << 20
		flooders = 20
		padding  = 4 << 20
	)
	p, c := startAbusePicker(t, memLimit)
	client := extprocv3.NewExternalProcessorClient(p.Conn(t))
	ctx := testCtx(t)
	// The normal client connects before the flood: what is measured is
	// decisions during it, not a TCP connect that, on a loaded machine,
	// timed out while the picker decoded 80 MiB of headers.
	routeNormal(t, c, 1)

	pad := strings.Repeat("a", padding)
	var wg sync.WaitGroup
	answers := make(chan string, flooders)
	for range flooders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs, err := openRaw(ctx, client, 1000, http.Header{"x-pad": {pad}})
			if err != nil {
				answers <- err.Error()
				return
			}
			st, reason, body, err := rs.answer(launch.EventTimeout)
			if err != nil {
				answers <- err.Error()
				return
			}
			answers <- strconv.Itoa(st) + " " + reason + " " + string(body)
		}()
	}
	lat := routeNormal(t, c, 20)
	t.Logf("decision latency of 20 requests during a flood of %d × %d MiB header blocks: %s", flooders, padding>>20, latencySummary(lat))
	wg.Wait()
	close(answers)
	for a := range answers {
		if !strings.HasPrefix(a, "431 headers_too_large ") || !strings.Contains(a, "the limit of 65536 bytes") {
			t.Errorf("flooder answered %.200s, want 431 headers_too_large naming the limit of --max-header-bytes", a)
		}
	}
	p.Metrics.Await(t, flooders, "laneway_extproc_streams_total", "outcome", "headers_too_large")
	p.Metrics.Await(t, 0, "laneway_held_header_bytes")
	checkPeakRSS(t, p, memLimit, "20 × 4 MiB header flood")
}
