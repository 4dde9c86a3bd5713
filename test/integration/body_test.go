package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/pkg/extproc"
)

// bodyBytes is the size of the large bodies (SPEC §7 chunking: more than
// three 62,000-byte chunks).
const bodyBytes = 200_000

// largeBody is a completions request of exactly bodyBytes bytes whose prompt
// holds multi-byte UTF-8 and characters JSON escapes, so any corruption of
// the stream shows.
func largeBody(t *testing.T) []byte {
	t.Helper()
	words := []string{"lane", "way", "größe", "日本語", "quote\"d", "tab\t", "back\\slash", "emoji😀", "plain"}
	marshal := func(prompt string) []byte {
		b, err := json.Marshal(map[string]any{"model": "test-model", "prompt": prompt, "max_tokens": 1})
		if err != nil {
			t.Fatalf("marshal large body: %v", err)
		}
		return b
	}
	// Escapes make the JSON longer than the prompt: grow to about 90%,
	// measure once, then pad with ASCII to the exact size.
	var prompt bytes.Buffer
	for i := 0; prompt.Len() < bodyBytes*9/10; i++ {
		prompt.WriteString(words[(i*7+i/3)%len(words)])
		prompt.WriteByte(' ')
	}
	b := marshal(prompt.String())
	if len(b) > bodyBytes {
		t.Fatalf("large body base is %d bytes, over %d", len(b), bodyBytes)
	}
	prompt.Write(bytes.Repeat([]byte{'x'}, bodyBytes-len(b)))
	if b = marshal(prompt.String()); len(b) != bodyBytes {
		t.Fatalf("large body is %d bytes, want %d", len(b), bodyBytes)
	}
	return b
}

// TestLargeBodyRoundTrip sends a 200 kB body through the picker and on to a
// real backend that echoes it, then plays the echo back through the
// response phase, in FULL_DUPLEX_STREAMED and BUFFERED modes.
func TestLargeBodyRoundTrip(t *testing.T) {
	launch.CheckGoroutines(t)
	bs := startBackends(t, 1)
	p := startEPP(t, launch.EPPOptions{Endpoints: addrs(bs)})
	body := largeBody(t)
	conn := p.Conn(t)

	for _, mode := range []struct {
		name string
		mode extprocclient.Mode
	}{{"full duplex", extprocclient.FullDuplex}, {"buffered", extprocclient.Buffered}} {
		t.Run(mode.name, func(t *testing.T) {
			// 16 KiB request messages: the picker reassembles many chunks.
			c := extprocclient.New(conn, extprocclient.Options{Mode: mode.mode, ChunkBytes: 16 << 10})
			ex := mustStart(t, c, spec(body))
			mustRoute(t, ex)
			if d := ex.Decision(); !bytes.Equal(d.Body, body) {
				t.Fatalf("request body after the picker: %d bytes differing from the %d sent", len(d.Body), len(body))
			}
			status, out := forward(t, ex, "/v1/completions", http.Header{"x-test-echo": {"1"}, "content-type": {"application/json"}}, 50_000)
			if status != http.StatusOK {
				t.Fatalf("upstream status %d", status)
			}
			if !bytes.Equal(out, body) {
				t.Fatalf("response body after the picker: %d bytes; want the %d-byte echo intact", len(out), len(body))
			}
			seen := bs[0].requests()
			last := seen[len(seen)-1]
			if last.bodyLen != len(body) {
				t.Errorf("backend received %d bytes, want %d", last.bodyLen, len(body))
			}
		})
	}
	p.Metrics.Await(t, 0, "laneway_endpoint_in_flight_requests")
}

// TestStreamedChunkSizes reads the raw ext_proc messages: a 200 kB request
// body sent as one message comes back as streamed chunks of at most 62,000
// bytes that add up to the body, and so does a 200 kB response body.
func TestStreamedChunkSizes(t *testing.T) {
	launch.CheckGoroutines(t)
	bs := startBackends(t, 1)
	p := startEPP(t, launch.EPPOptions{Endpoints: addrs(bs)})
	body := largeBody(t)
	ctx, cancel := context.WithTimeout(context.Background(), launch.EventTimeout)
	defer cancel()
	stream, err := extprocv3.NewExternalProcessorClient(p.Conn(t)).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send := func(m *extprocv3.ProcessingRequest) {
		t.Helper()
		if err := stream.Send(m); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				{Key: ":method", RawValue: []byte("POST")},
				{Key: ":path", RawValue: []byte("/v1/completions")},
				{Key: ":authority", RawValue: []byte("localhost")},
				{Key: "content-type", RawValue: []byte("application/json")},
				{Key: "content-length", RawValue: []byte(strconv.Itoa(len(body)))},
			}},
		}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{
			RequestBodyMode:  filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		},
	})
	send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true},
	}})

	m, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	hr, ok := m.GetResponse().(*extprocv3.ProcessingResponse_RequestHeaders)
	if !ok {
		t.Fatalf("first answer %T, want request headers", m.GetResponse())
	}
	if !hr.RequestHeaders.GetResponse().GetClearRouteCache() {
		t.Error("pick without clear_route_cache")
	}
	got, sizes, err := readStreamed(stream, true)
	if err != nil {
		t.Fatal(err)
	}
	checkChunks(t, "request", got, sizes, body)

	send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":status", RawValue: []byte("200")},
		}}},
	}})
	if m, err = stream.Recv(); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.GetResponse().(*extprocv3.ProcessingResponse_ResponseHeaders); !ok {
		t.Fatalf("answer %T, want response headers", m.GetResponse())
	}
	send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: body, EndOfStream: true},
	}})
	got, sizes, err = readStreamed(stream, false)
	if err != nil {
		t.Fatal(err)
	}
	checkChunks(t, "response", got, sizes, body)

	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("after the response the picker sent %v, want the end of the stream", err)
	}
	p.Metrics.Await(t, 0, "laneway_endpoint_in_flight_requests")
}

// readStreamed collects streamed body answers until end_of_stream.
func readStreamed(stream extprocv3.ExternalProcessor_ProcessClient, request bool) ([]byte, []int, error) {
	var got []byte
	var sizes []int
	for {
		m, err := stream.Recv()
		if err != nil {
			return got, sizes, fmt.Errorf("receive streamed body: %w", err)
		}
		var br *extprocv3.BodyResponse
		switch r := m.GetResponse().(type) {
		case *extprocv3.ProcessingResponse_RequestBody:
			if request {
				br = r.RequestBody
			}
		case *extprocv3.ProcessingResponse_ResponseBody:
			if !request {
				br = r.ResponseBody
			}
		}
		if br == nil {
			return got, sizes, fmt.Errorf("unexpected answer %T while streaming a body", m.GetResponse())
		}
		sr := br.GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			return got, sizes, fmt.Errorf("body answer without a streamed_response")
		}
		got = append(got, sr.GetBody()...)
		sizes = append(sizes, len(sr.GetBody()))
		if sr.GetEndOfStream() {
			return got, sizes, nil
		}
	}
}

func checkChunks(t *testing.T, what string, got []byte, sizes []int, want []byte) {
	t.Helper()
	for i, n := range sizes {
		if n > extproc.MaxChunkBytes {
			t.Errorf("%s chunk %d is %d bytes, more than %d", what, i, n, extproc.MaxChunkBytes)
		}
	}
	if len(sizes) < (len(want)+extproc.MaxChunkBytes-1)/extproc.MaxChunkBytes {
		t.Errorf("%s came back in %d chunks %v", what, len(sizes), sizes)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s body: %d bytes came back, not equal to the %d sent", what, len(got), len(want))
	}
}
