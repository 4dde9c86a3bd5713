package epp

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/pkg/sched"
)

// benchPromptBody is the load tool's request: a completions body with a
// token-id prompt of n tokens.
func benchPromptBody(b *testing.B, n int) []byte {
	prompt := make([]int, n)
	for i := range prompt {
		prompt[i] = 1 + (i*7919)%50000
	}
	body, err := json.Marshal(map[string]any{"model": "loadgen", "prompt": prompt, "max_tokens": 1, "stream": true})
	if err != nil {
		b.Fatal(err)
	}
	return body
}

// benchResponseChunk is the load tool's response body: one SSE event and
// the end marker.
var benchResponseChunk = []byte("data: {\"choices\":[{\"text\":\"x\",\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n")

// startBenchServer runs a plaintext picker on loopback, wired as cmd/epp
// wires it (prefix picker, Prometheus metrics, readiness gate), with one
// idle endpoint and scraping off (the endpoint's load is what this picker
// sent it, so it never looks busy here).
func startBenchServer(b *testing.B) *Server {
	b.Helper()
	s := newTestServer(b, nil)
	s.Dispatcher().SetEndpoints([]sched.Endpoint{{Addr: "127.0.0.2:8000", MaxBatchedTokens: s.opts.MaxNumBatchedTokens}})
	s.SetReady(true)
	runServer(b, s)
	return s
}

// memStream is an ext_proc server stream without a transport: Recv hands
// out a fixed exchange, Send marshals each answer as gRPC would (answers
// differ in encoding cost, so that cost belongs to the measurement) and
// counts it.
type memStream struct {
	grpc.ServerStream // not used by the stream handler; nil
	ctx               context.Context
	in                []*extprocv3.ProcessingRequest
	next              int
	sent              int
	buf               []byte
}

func (m *memStream) Context() context.Context { return m.ctx }

func (m *memStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if m.next == len(m.in) {
		return nil, io.EOF
	}
	m.next++
	return m.in[m.next-1], nil
}

func (m *memStream) Send(r *extprocv3.ProcessingResponse) error {
	var err error
	m.buf, err = proto.MarshalOptions{}.MarshalAppend(m.buf[:0], r)
	m.sent++
	return err
}

// loadExchange is the message sequence the load tool's gateway plays for
// one request: FULL_DUPLEX_STREAMED headers and a one-chunk body, then
// response headers and a one-chunk response body that ends the stream.
func loadExchange(body []byte) []*extprocv3.ProcessingRequest {
	hv := func(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, RawValue: []byte(v)} }
	return []*extprocv3.ProcessingRequest{
		{
			Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
				Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
					hv(":authority", "localhost"), hv(":path", "/v1/completions"), hv(":method", "POST"), hv(":scheme", "http"),
					hv("content-type", "application/json"), hv("content-length", strconv.Itoa(len(body))),
				}},
			}},
			ProtocolConfig: &extprocv3.ProtocolConfiguration{
				RequestBodyMode:  filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
				ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			},
		},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}},
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{hv(":status", "200"), hv("content-type", "text/event-stream")}},
		}}},
		{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: benchResponseChunk, EndOfStream: true}}},
	}
}

// processCPU is the CPU time this process has used, user and system.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU adds cpu-ns/op: the process's CPU time per stream, every
// goroutine and the collector included. On a shared machine it is steadier
// than ns/op, which also counts waiting for a core.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(processCPU(b)-start)/float64(b.N), "cpu-ns/op")
}

// BenchmarkStream256Idle is the picker's whole per-stream work for the
// load test's request (SPEC §13: a 256-token prompt, an idle endpoint):
// headers and body in, parse and prefix hashing, the dispatcher's
// admission and pick, the answer and body echo, the response phase with
// its first-byte and done releases, and the metrics.
//
// inproc runs the stream handler on a transport-less stream, so it
// measures Laneway's own work (plus marshalling its answers); grpc plays
// the same exchange over a real loopback connection, client included.
// cpu-ns/op is the process's CPU time per stream.
func BenchmarkStream256Idle(b *testing.B) {
	s := startBenchServer(b)
	body := benchPromptBody(b, 256)

	b.Run("inproc", func(b *testing.B) {
		msgs := loadExchange(body)
		ms := &memStream{in: msgs}
		b.ReportAllocs()
		cpu0 := processCPU(b)
		for b.Loop() {
			ctx, cancel := context.WithCancel(context.Background())
			ms.ctx, ms.next, ms.sent = ctx, 0, 0
			if err := s.ext.Process(ms); err != nil {
				b.Fatalf("Process: %v", err)
			}
			cancel()
			if ms.sent != 4 {
				b.Fatalf("%d answers, want 4 (pick, body echo, response headers, response body)", ms.sent)
			}
		}
		reportCPU(b, cpu0)
	})

	b.Run("grpc", func(b *testing.B) {
		grpcAddr, _, _ := s.Addrs()
		conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		c := extprocclient.New(conn, extprocclient.Options{})
		spec := extprocclient.RequestSpec{Path: "/v1/completions", Headers: http.Header{"content-type": {"application/json"}}, Body: body}
		ctx := context.Background()
		b.ReportAllocs()
		cpu0 := processCPU(b)
		for b.Loop() {
			ex, err := c.Start(ctx, spec)
			if err != nil {
				b.Fatalf("Start: %v", err)
			}
			if !ex.Decision().Routed() {
				b.Fatalf("not routed: %+v", ex.Decision().Immediate)
			}
			if _, _, err := ex.Respond(http.StatusOK, http.Header{"content-type": {"text/event-stream"}}, benchResponseChunk); err != nil {
				b.Fatalf("Respond: %v", err)
			}
			if err := ex.Close(); err != nil {
				b.Fatalf("Close: %v", err)
			}
		}
		reportCPU(b, cpu0)
	})
}
