package integration

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/pkg/extproc"
)

// TestSIGTERMDrain: on SIGTERM readiness goes NOT_SERVING, every queued
// stream is answered 503 shutting_down, a dispatched stream still plays its
// response to the end, and the process exits 0.
func TestSIGTERMDrain(t *testing.T) {
	launch.CheckGoroutines(t)
	bs := startBackends(t, 1)
	p := startEPP(t, launch.EPPOptions{Endpoints: addrs(bs), Policy: writePolicy(t, busyPolicy)})
	c := p.Client(t, extprocclient.Options{})

	holder := mustStart(t, c, spec(tokens(500, 0)))
	mustRoute(t, holder)
	ctx := testCtx(t)
	const n = 5
	answers := make(chan started, n)
	for i := 0; i < n; i++ {
		startInto(ctx, c, "queued", spec(tokens(150, i+1)), answers)
	}
	p.Metrics.Await(t, n, "dynamo_frontend_router_queue_pending_requests", "policy_class", "standard")

	hconn, err := grpc.NewClient(p.HealthAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer hconn.Close()
	watch, err := healthpb.NewHealthClient(hconn).Watch(ctx, &healthpb.HealthCheckRequest{Service: "readiness"})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := watch.Recv(); err != nil || st.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("readiness before SIGTERM: %v %v", st, err)
	}

	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if st, err := watch.Recv(); err != nil || st.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("readiness after SIGTERM: %v %v, want NOT_SERVING", st, err)
	}
	for i := 0; i < n; i++ {
		s := await(t, answers)
		immediate(t, s.ex, http.StatusServiceUnavailable, "shutting_down")
		s.ex.Close()
	}
	// The dispatched stream drains normally.
	sendFirstByte(t, holder)
	if out, err := holder.SendResponseBody([]byte("data: [DONE]\n\n"), true); err != nil || string(out) != "data: [DONE]\n\n" {
		t.Fatalf("last chunk after SIGTERM: %q %v", out, err)
	}
	if err := holder.Close(); err != nil {
		t.Fatalf("close drained stream: %v", err)
	}
	if err := p.Wait(drainTimeout); err != nil {
		t.Fatal(err)
	}
}

// TestTLS: with the default --secure-serving the ext_proc port speaks TLS
// with ALPN h2 and a gateway that skips verification (the self-signed case)
// gets picks; a plaintext client does not.
func TestTLS(t *testing.T) {
	launch.CheckGoroutines(t)
	bs := startBackends(t, 1)
	p := startEPP(t, launch.EPPOptions{Endpoints: addrs(bs), TLS: true})

	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: launch.EventTimeout}, "tcp", p.GRPCAddr, &tls.Config{
		InsecureSkipVerify: true, //nolint:gosec // the picker's certificate is self-signed
		NextProtos:         []string{"h2"},
	})
	if err != nil {
		t.Fatalf("TLS handshake: %v", err)
	}
	st := conn.ConnectionState()
	conn.Close()
	if st.NegotiatedProtocol != "h2" {
		t.Errorf("ALPN negotiated %q, want h2", st.NegotiatedProtocol)
	}
	if len(st.PeerCertificates) == 0 {
		t.Error("no server certificate")
	}

	c := p.Client(t, extprocclient.Options{})
	ex := mustStart(t, c, spec(tokens(32, 1)))
	if got := mustRoute(t, ex); got != bs[0].addr {
		t.Fatalf("pick %s, want %s", got, bs[0].addr)
	}
	status, out := forward(t, ex, "/v1/completions", http.Header{}, 1024)
	var reply backendReply
	if status != http.StatusOK || json.Unmarshal(out, &reply) != nil || reply.ServedBy != bs[0].addr {
		t.Errorf("round trip over TLS: status %d body %q", status, out)
	}

	// The health service is also served on the TLS ext_proc port, where
	// Envoy's gRPC health check of the ext_proc cluster goes.
	hc := healthpb.NewHealthClient(p.Conn(t))
	ctx, cancel := context.WithTimeout(context.Background(), launch.EventTimeout)
	defer cancel()
	if r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: extproc.ServiceName}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health of %s over TLS: %v %v", extproc.ServiceName, r, err)
	}

	plain, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	pctx, pcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer pcancel()
	if ex, err := extprocclient.New(plain, extprocclient.Options{}).Start(pctx, spec(tokens(8, 2))); err == nil {
		ex.Close()
		t.Error("a plaintext client got an answer from the TLS port")
	}
}

// TestHealthServices: every health service name of SPEC §7 answers
// SERVING on the health port of a ready picker.
func TestHealthServices(t *testing.T) {
	launch.CheckGoroutines(t)
	p := startEPP(t, launch.EPPOptions{})
	conn, err := grpc.NewClient(p.HealthAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), launch.EventTimeout)
	defer cancel()
	for _, name := range []string{"liveness", "readiness", extproc.ServiceName, "inference-extension"} {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: name})
		if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q: %v %v, want SERVING", name, r, err)
		}
	}
}

// TestShutdownDelay: after SIGTERM the picker reports NotReady at once but
// keeps serving new streams for --shutdown-delay, so that the endpoints
// controller and the gateways stop sending before it stops accepting: a
// stream opened 2 s after SIGTERM, on a connection opened then, is routed
// and completes. Once the delay is over the listener is closed: a new
// stream is refused with gRPC Unavailable (connection refused), while a
// stream dispatched before SIGTERM still plays to its end and the process
// exits 0 within the drain.
func TestShutdownDelay(t *testing.T) {
	const delay = 4 * time.Second
	launch.CheckGoroutines(t)
	bs := startBackends(t, 1)
	p := startEPP(t, launch.EPPOptions{Endpoints: addrs(bs), Args: []string{"--shutdown-delay=" + delay.String()}})
	c := p.Client(t, extprocclient.Options{})
	early := mustStart(t, c, spec(tokens(32, 1)))
	mustRoute(t, early)

	hconn, err := grpc.NewClient(p.HealthAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer hconn.Close()
	ctx := testCtx(t)
	watch, err := healthpb.NewHealthClient(hconn).Watch(ctx, &healthpb.HealthCheckRequest{Service: "readiness"})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := watch.Recv(); err != nil || st.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("readiness before SIGTERM: %v %v", st, err)
	}

	stopped := p.Log.Await("stopped accepting")
	t0 := time.Now()
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if st, err := watch.Recv(); err != nil || st.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("readiness after SIGTERM: %v %v, want NOT_SERVING", st, err)
	}
	t.Logf("NotReady %v after SIGTERM", time.Since(t0).Round(time.Millisecond))

	// 2 s into the delay a gateway that has not yet seen the endpoint
	// change opens a connection and a stream: it is served.
	time.Sleep(time.Until(t0.Add(2 * time.Second))) // the scenario's point in time, not a wait for an event
	late := p.Client(t, extprocclient.Options{})
	ex := mustStart(t, late, spec(tokens(32, 2)))
	if got := mustRoute(t, ex); got != bs[0].addr {
		t.Fatalf("stream 2 s after SIGTERM routed to %s, want %s", got, bs[0].addr)
	}
	if code, out := forward(t, ex, "/v1/completions", http.Header{}, 1024); code != http.StatusOK {
		t.Fatalf("stream 2 s after SIGTERM: upstream status %d body %q", code, out)
	}

	// After the delay the picker stops accepting: a new connection is
	// refused.
	launch.Receive(t, stopped, "the picker to stop accepting after SIGTERM")
	if since := time.Since(t0); since < delay {
		t.Errorf("stopped accepting %v after SIGTERM, before the %v delay", since, delay)
	}
	refused := p.Client(t, extprocclient.Options{})
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if ex, err := refused.Start(rctx, spec(tokens(32, 3))); err == nil {
		d := ex.Decision()
		ex.Close()
		t.Fatalf("stream after the delay answered %+v, want refused", d)
	} else if status.Code(err) != codes.Unavailable {
		t.Errorf("stream after the delay: %v, want gRPC Unavailable", err)
	}

	// The stream dispatched before SIGTERM finishes, and the picker exits 0.
	completeStream(t, early)
	if err := p.Wait(drainTimeout); err != nil {
		t.Fatal(err)
	}
}
