package epp

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/pkg/sched"
)

// testOptions are a plaintext picker's options on loopback ports the
// kernel picks, scraping off; configure may change them.
func testOptions(configure func(*Options)) *Options {
	o := NewOptions()
	o.BindAddress = "127.0.0.1"
	o.GRPCPort, o.GRPCHealthPort, o.MetricsPort, o.StatusPort = 0, 0, 0, 0
	o.SecureServing = false
	o.Intel.ScrapeMetrics = false
	o.ShutdownDelay = 0
	if configure != nil {
		configure(o)
	}
	return o
}

// newTestServer builds a picker with testOptions and the default policy.
func newTestServer(tb testing.TB, configure func(*Options)) *Server {
	tb.Helper()
	s, err := NewServer(testOptions(configure), defaultPolicy(tb), BodyParser{}, logr.Discard())
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// defaultPolicy is the synthetic default class.
func defaultPolicy(tb testing.TB) *sched.Policy {
	tb.Helper()
	c, err := LoadPolicy("")
	if err != nil {
		tb.Fatal(err)
	}
	return sched.FromCompiled(c)
}

// runServer runs s with parts until the test ends and then requires that
// Run returned nil; the returned function ends Run early and returns its
// error.
func runServer(tb testing.TB, s *Server, parts ...manager.Runnable) (stop func() error) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, parts...) }()
	var err error
	stopped := false
	stop = func() error {
		if !stopped {
			cancel()
			err, stopped = <-done, true
		}
		return err
	}
	tb.Cleanup(func() {
		if err := stop(); err != nil {
			tb.Errorf("Run: %v", err)
		}
	})
	return stop
}

// readiness asks the health port for the readiness status.
func readiness(ctx context.Context, addr string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: HealthReadiness})
	return r.GetStatus(), err
}

// TestRunOrdersParts: a part starts once the servers answer, and when Run
// is stopped the part is told to stop while the health server still
// answers (NOT_SERVING: the drain has begun); Run returns only after the
// part has.
func TestRunOrdersParts(t *testing.T) {
	s := newTestServer(t, nil)
	s.SetReady(true)
	_, healthAddr, _ := s.Addrs()
	type check struct {
		st  healthpb.HealthCheckResponse_ServingStatus
		err error
	}
	atStart, atStop := make(chan check, 1), make(chan check, 1)
	part := manager.RunnableFunc(func(ctx context.Context) error {
		var c check
		c.st, c.err = readiness(ctx, healthAddr)
		atStart <- c
		<-ctx.Done()
		c.st, c.err = readiness(context.Background(), healthAddr)
		atStop <- c
		return nil
	})
	stop := runServer(t, s, part)
	if c := <-atStart; c.err != nil || c.st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("readiness when the part started: %v %v, want SERVING", c.st, c.err)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	select {
	case c := <-atStop:
		if c.err != nil || c.st != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("readiness when the part was stopped: %v %v, want NOT_SERVING from a live health server", c.st, c.err)
		}
	default:
		t.Fatal("Run returned before its part did")
	}
}

// TestRunPartStopsFirst: a part that returns on its own (the manager once
// leadership is lost) begins the drain: the other parts are stopped, a
// late SetReady(true) (a readiness gate that has not seen its stop yet)
// does not reopen the server, and Run returns the part's error.
func TestRunPartStopsFirst(t *testing.T) {
	s := newTestServer(t, nil)
	lost := errors.New("leader election lost")
	failing := manager.RunnableFunc(func(context.Context) error { return lost })
	late := make(chan healthpb.HealthCheckResponse_ServingStatus, 1)
	gate := manager.RunnableFunc(func(ctx context.Context) error {
		<-ctx.Done()
		s.SetReady(true)
		r, err := s.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: HealthReadiness})
		if err != nil {
			return err
		}
		late <- r.GetStatus()
		return nil
	})
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background(), failing, gate) }()
	if err := <-done; !errors.Is(err, lost) {
		t.Fatalf("Run = %v, want the part's error %v", err, lost)
	}
	if st := <-late; st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("readiness after SetReady(true) during the drain: %v, want NOT_SERVING", st)
	}
	if reason := s.gate(); reason != ReasonNotReady {
		t.Errorf("gate after the drain: %q, want %q", reason, ReasonNotReady)
	}
}

// TestServerPprof: --pprof-port serves the pprof handlers on their own
// port for as long as Run runs; a port already taken fails NewServer,
// naming the flag.
func TestServerPprof(t *testing.T) {
	// A free port can be taken by another test package's listener before
	// NewServer binds it: try a few.
	var s *Server
	for attempt := 0; s == nil; attempt++ {
		port, err := launch.FreePort("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		s, err = NewServer(testOptions(func(o *Options) { o.PprofPort = port }), defaultPolicy(t), BodyParser{}, logr.Discard())
		if err != nil && (attempt == 4 || !strings.Contains(err.Error(), "address already in use")) {
			t.Fatal(err)
		}
	}
	addr := s.pprofLn.Addr().String()
	stop := runServer(t, s)
	cases := []struct {
		path string
		want string
	}{
		{"/debug/pprof/", "goroutine"},
		{"/debug/pprof/cmdline", os.Args[0]}, // this process's own command line
		{"/debug/pprof/goroutine?debug=1", "goroutine profile"},
	}
	for _, tc := range cases {
		resp, err := http.Get("http://" + addr + tc.path)
		if err != nil {
			t.Fatalf("GET %s: %v", tc.path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), tc.want) {
			t.Errorf("GET %s: %d, body without %q", tc.path, resp.StatusCode, tc.want)
		}
	}
	_, _, metricsAddr := s.Addrs()
	resp, err := http.Get("http://" + metricsAddr + "/debug/pprof/")
	if err != nil {
		t.Fatalf("GET /debug/pprof/ on the metrics port: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /debug/pprof/ on the metrics port: %s, want 404", resp.Status)
	}

	port := s.pprofLn.Addr().(*net.TCPAddr).Port
	taken := testOptions(func(o *Options) { o.PprofPort = port })
	if _, err := NewServer(taken, defaultPolicy(t), BodyParser{}, logr.Discard()); err == nil || !strings.Contains(err.Error(), "--pprof-port") {
		t.Errorf("NewServer on the taken pprof port %d: %v, want an error naming --pprof-port", port, err)
	}

	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Errorf("pprof port %s still open after Run returned", addr)
	}
}
