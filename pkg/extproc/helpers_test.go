package extproc_test

import (
	"bytes"
	"context"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/laneway-dev/laneway/pkg/extproc"
)

// deciderFunc adapts a function to extproc.Decider.
type deciderFunc func(ctx context.Context, req *extproc.Request) (extproc.Decision, error)

func (f deciderFunc) Decide(ctx context.Context, req *extproc.Request) (extproc.Decision, error) {
	return f(ctx, req)
}

// fixed routes every request to the given endpoints.
func fixed(endpoints ...string) extproc.Decider {
	return deciderFunc(func(context.Context, *extproc.Request) (extproc.Decision, error) {
		return extproc.Decision{Endpoints: endpoints}, nil
	})
}

// outcomes records Observer calls and signals each one.
type outcomes struct {
	mu   sync.Mutex
	list []string
	ch   chan string
}

func newOutcomes() *outcomes { return &outcomes{ch: make(chan string, 64)} }

func (o *outcomes) StreamDone(outcome string) {
	o.mu.Lock()
	o.list = append(o.list, outcome)
	o.mu.Unlock()
	o.ch <- outcome
}

// next waits for the next finished stream's outcome.
func (o *outcomes) next(t *testing.T) string {
	t.Helper()
	select {
	case s := <-o.ch:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("no stream finished within 10s")
		return ""
	}
}

// lifecycle records the events of one dispatched request.
type lifecycle struct {
	mu     sync.Mutex
	events []string
	done   chan struct{}
}

func newLifecycle() *lifecycle { return &lifecycle{done: make(chan struct{})} }

func (l *lifecycle) FirstByte() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, "first_byte")
}

func (l *lifecycle) Done() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, "done")
	close(l.done) // a second Done panics, which fails the test
}

// wait returns the events once Done was called.
func (l *lifecycle) wait(t *testing.T) []string {
	t.Helper()
	select {
	case <-l.done:
	case <-time.After(10 * time.Second):
		t.Fatal("Lifecycle.Done not called within 10s")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.events...)
}

// startServer serves an extproc.Server on a loopback port and returns a
// client connection to it; both are torn down with the test.
func startServer(t testing.TB, d extproc.Decider, opts extproc.Options) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	gs := grpc.NewServer()
	extproc.NewServer(d, opts).Register(gs)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = gs.Serve(lis)
	}()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial %s: %v", lis.Addr(), err)
	}
	t.Cleanup(func() {
		conn.Close()
		gs.Stop()
		<-served
	})
	return conn
}

// openStream opens a raw ext_proc stream for tests that check individual
// protocol messages.
func openStream(t *testing.T, conn *grpc.ClientConn) (extprocv3.ExternalProcessor_ProcessClient, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	s, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		cancel()
		t.Fatalf("open stream: %v", err)
	}
	t.Cleanup(cancel)
	return s, cancel
}

// waitNoProcessGoroutines fails the test if a stream handler goroutine is
// still alive after the deadline. Stream handlers end asynchronously to the
// client, and there is no event for "goroutine exited", so this polls.
func waitNoProcessGoroutines(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if !bytes.Contains(buf[:n], []byte("extproc.(*Server).Process")) &&
			!bytes.Contains(buf[:n], []byte("extproc_test.deciderFunc.Decide")) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream goroutines still running after 5s:\n%s", buf[:n])
		}
		time.Sleep(5 * time.Millisecond)
	}
}
