package load

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
)

// serveFloor runs a floor server on a loopback port for the test.
func serveFloor(t *testing.T, endpoint string, secure bool) string {
	t.Helper()
	srv, err := NewFloorServer(endpoint, secure)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return lis.Addr().String()
}

// TestFloorAnswersLikeAPicker: the floor's answer is a pick, header and
// metadata equal, with route re-evaluation, the body streamed back intact,
// and a response played through: the same exchange the load tool plays
// against Laneway, so the two are measured on the same protocol.
func TestFloorAnswersLikeAPicker(t *testing.T) {
	const endpoint = "127.0.0.7:8000"
	addr := serveFloor(t, endpoint, false)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := []byte(`{"model":"m","prompt":[1,2,3]}`)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ex, err := extprocclient.New(conn, extprocclient.Options{}).Start(ctx, extprocclient.RequestSpec{Path: "/v1/completions", Body: body})
	if err != nil {
		t.Fatal(err)
	}
	d := ex.Decision()
	if !d.Routed() || !slices.Equal(d.Endpoints, []string{endpoint}) || !slices.Equal(d.MetadataEndpoints, []string{endpoint}) ||
		!d.ClearRouteCache || string(d.Body) != string(body) {
		t.Fatalf("decision %+v, want a pick of %s in header and metadata, route cache cleared, body intact", d, endpoint)
	}
	_, got, err := ex.Respond(http.StatusOK, nil, []byte("data: 1\n\n"), []byte("data: [DONE]\n\n"))
	if err != nil || string(got) != "data: 1\n\ndata: [DONE]\n\n" {
		t.Fatalf("response body %q, %v", got, err)
	}
	if err := ex.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestH2RunnerAgainstFloor drives the floor as loadgen --compare-floor
// does, in cleartext and TLS: every request routed, and on Linux every
// decision also timed to the kernel's receive timestamp, never later than
// the reader saw it.
func TestH2RunnerAgainstFloor(t *testing.T) {
	for _, secure := range []bool{false, true} {
		t.Run(map[bool]string{false: "cleartext", true: "tls"}[secure], func(t *testing.T) {
			r := &H2Runner{Addr: serveFloor(t, "127.0.0.7:8000", secure), Conns: 2}
			if secure {
				r.TLS = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // self-signed test server
			}
			res, err := r.RunOpen(context.Background(), Config{Rate: 400, Hold: 20 * time.Millisecond, Duration: 500 * time.Millisecond, PromptTokens: 256})
			if err != nil {
				t.Fatal(err)
			}
			if res.Started != 200 || res.Routed != 200 || res.Errors != 0 {
				t.Fatalf("result %+v, want 200 routed", res)
			}
			if runtime.GOOS != "linux" {
				return
			}
			if res.Wire.N != res.Latency.N || res.Wire.P50 <= 0 || res.Wire.P50 > res.Latency.P50 || res.Wire.Max > res.Latency.Max {
				t.Errorf("wire %+v against latency %+v: want every decision timed, none later than the reader", res.Wire, res.Latency)
			}
			if !strings.Contains(res.String(), "on the wire:") {
				t.Errorf("report lacks the wire line:\n%s", res.String())
			}
		})
	}
}
