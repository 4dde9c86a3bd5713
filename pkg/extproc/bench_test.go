package extproc_test

import (
	"context"
	"testing"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/pkg/extproc"
)

// BenchmarkFullDuplexStream measures one whole FULL_DUPLEX_STREAMED stream
// over a real loopback gRPC connection with an instant decider: request
// headers + one body chunk, the headers answer and body echo, then response
// headers, one response body chunk with its echo, and the orderly close.
// Client and server costs are both counted, as both run in this process.
func BenchmarkFullDuplexStream(b *testing.B) {
	conn := startServer(b, fixed("10.0.0.1:8000"), extproc.Options{})
	c := extprocclient.New(conn, extprocclient.Options{})
	spec := extprocclient.RequestSpec{
		Path: "/v1/completions",
		Body: []byte(`{"model":"m","prompt":"Say hello in five words.","max_tokens":16,"stream":true}`),
	}
	chunk := []byte("data: {\"choices\":[{\"text\":\"hello\"}]}\n\ndata: [DONE]\n\n")
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		ex, err := c.Start(ctx, spec)
		if err != nil {
			b.Fatalf("Start: %v", err)
		}
		if !ex.Decision().Routed() {
			b.Fatal("not routed")
		}
		if _, _, err := ex.Respond(200, nil, chunk); err != nil {
			b.Fatalf("Respond: %v", err)
		}
		if err := ex.Close(); err != nil {
			b.Fatalf("Close: %v", err)
		}
	}
}
