package ha

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/laneway-dev/laneway/internal/dispatcher"
	"github.com/laneway-dev/laneway/internal/tlsutil"
	"github.com/laneway-dev/laneway/pkg/drr"
	"github.com/laneway-dev/laneway/pkg/extproc"
	"github.com/laneway-dev/laneway/pkg/policy"
	"github.com/laneway-dev/laneway/pkg/replica"
	"github.com/laneway-dev/laneway/pkg/sched"
)

// lanePolicy has one queueing fcfs class, "lane": an endpoint is busy for
// it from 1,536 prefill tokens, so one 2,000-token request fills it; at
// most limit requests queue.
func lanePolicy(limit uint64) *sched.Policy {
	return &sched.Policy{
		Classes: []drr.ClassConfig{{Name: "lane", Quantum: 100, Policy: drr.FCFS, Queueing: true,
			RequestLimitPerWorker: limit, RawISLLimitPerWorker: drr.NoLimit, CachedLimitPerWorker: drr.NoLimit}},
		Busy:    []policy.BusyTest{{Threshold: 1536, HasThreshold: true}},
		Resolve: func(*sched.Ticket) int { return 0 },
	}
}

// startDispatcher runs a dispatcher over one endpoint until the test ends.
func startDispatcher(t testing.TB, limit uint64, ep string) *dispatcher.Dispatcher {
	t.Helper()
	return startDispatcherOf(t, lanePolicy(limit), ep)
}

// startDispatcherOf runs a dispatcher with pol over one endpoint.
func startDispatcherOf(t testing.TB, pol *sched.Policy, ep string) *dispatcher.Dispatcher {
	t.Helper()
	d, err := dispatcher.New(pol, dispatcher.Options{Options: sched.Options{Prefix: &sched.PrefixOptions{}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	d.SetEndpoints([]sched.Endpoint{{Addr: ep, MaxBatchedTokens: 8192}})
	return d
}

// view is a LeaderView the test sets.
type view struct {
	leading atomic.Bool
	leader  atomic.Pointer[string]
}

func (v *view) IsLeader() bool { return v.leading.Load() }
func (v *view) Leader() string {
	if p := v.leader.Load(); p != nil {
		return *p
	}
	return ""
}
func (v *view) set(holder string) { v.leader.Store(&holder) }

// answer maps a queue-limit rejection to a 429 as the picker's handler
// does (the shape matters, not the words).
func replyOf(err error) error {
	var rej *drr.Rejection
	if errors.As(err, &rej) {
		return &extproc.Reply{Status: 429, Reason: "queue_limit", Message: rej.Error(), Body: []byte(`{"error":"` + rej.Error() + `"}`), RetryAfter: 3 * time.Second}
	}
	return &extproc.Reply{Status: 503, Reason: "other", Message: err.Error()}
}

// leader is a replica serving the link over mutual TLS on loopback.
type leader struct {
	d      *dispatcher.Dispatcher
	ts     *TicketServer
	srv    *grpc.Server
	holder string
	gate   atomic.Pointer[string]
	reg    *prometheus.Registry
	logs   *logLines
}

func startLeader(t testing.TB, ca *tlsutil.CA, limit uint64, ep string) *leader {
	t.Helper()
	return startLeaderOf(t, ca, lanePolicy(limit), ep)
}

// startLeaderOf is startLeader with the policy pol.
func startLeaderOf(t testing.TB, ca *tlsutil.CA, pol *sched.Policy, ep string) *leader {
	t.Helper()
	_, peers := replicaDir(t, ca)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &leader{d: startDispatcherOf(t, pol, ep), holder: holderIdentity("leader", ln.Addr().String(), "0a"), reg: prometheus.NewRegistry(), logs: &logLines{}}
	l.gate.Store(new(string))
	ts, err := NewTicketServer(TicketServerConfig{Scheduler: l.d, Self: l.holder, Gate: func() string { return *l.gate.Load() },
		Answer: replyOf, Registry: l.reg, Log: l.logs.logger()})
	if err != nil {
		t.Fatal(err)
	}
	l.ts = ts
	l.srv = grpc.NewServer(peers.ServerOptions()...)
	replica.Register(l.srv, ts)
	go func() { _ = l.srv.Serve(ln) }()
	t.Cleanup(l.srv.Stop)
	return l
}

// follower is a replica sending tickets, with its own dispatcher.
type follower struct {
	d    *dispatcher.Dispatcher
	c    *Tickets
	view *view
	reg  *prometheus.Registry
	logs *logLines
}

func startFollower(t testing.TB, ca *tlsutil.CA, ep string) *follower {
	t.Helper()
	_, peers := replicaDir(t, ca)
	f := &follower{d: startDispatcher(t, 1000, ep), view: &view{}, reg: prometheus.NewRegistry(), logs: &logLines{}}
	c, err := NewTickets(TicketsConfig{Leader: f.view, Self: "follower_127.0.0.1:1_0b", Local: f.d, TLS: peers, Registry: f.reg, Log: f.logs.logger()})
	if err != nil {
		t.Fatal(err)
	}
	f.c = c
	t.Cleanup(c.Close)
	return f
}

// follow points the follower at l and waits until its link is up.
func (f *follower) follow(t testing.TB, l *leader) {
	t.Helper()
	f.view.set(l.holder)
	if f.c.linkTo(l.holder) != nil {
		return
	}
	f.c.mu.Lock()
	lk := f.c.links[l.holder]
	f.c.mu.Unlock()
	select {
	case <-lk.ready:
	case <-lk.broken:
		t.Fatalf("the link broke: %v", lk.err)
	case <-time.After(10 * time.Second):
		t.Fatal("the link did not come up")
	}
}

func (f *follower) routes(route string) float64 {
	return testutil.ToFloat64(f.c.routes[route])
}

// logLines collects log lines.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		l.lines = append(l.lines, prefix+" "+args)
		l.mu.Unlock()
	}, funcr.Options{Verbosity: 3})
}

func (l *logLines) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			return true
		}
	}
	return false
}

type result struct {
	g   *sched.Grant
	err error
}

func acquireAsync(ctx context.Context, a Acquirer, t *sched.Ticket) <-chan result {
	ch := make(chan result, 1)
	go func() {
		g, err := a.Acquire(ctx, t)
		ch <- result{g, err}
	}()
	return ch
}

func receive(t *testing.T, ch <-chan result, what string) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatalf("no answer: %s", what)
		return result{}
	}
}

// waitQueued waits until d holds n queued requests (the queue has no
// event to await from outside: the test polls its snapshot).
func waitQueued(t *testing.T, d *dispatcher.Dispatcher, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, _ := d.Snapshot()
		if s.Queued == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queued = %d, want %d", s.Queued, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitInFlight waits until d's endpoint has n requests in flight.
func waitInFlight(t *testing.T, d *dispatcher.Dispatcher, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, _ := d.Snapshot()
		if s.Endpoints[0].InFlight == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("in flight = %d, want %d", s.Endpoints[0].InFlight, n)
		}
		time.Sleep(time.Millisecond)
	}
}

const ep = "10.0.0.1:8000"

// TestTicketJoinsTheLeadersQueue: a follower's ticket waits in the
// leader's one queue behind the leader's own request, is granted when
// that one is done, and its release events reach the leader's core.
func TestTicketJoinsTheLeadersQueue(t *testing.T) {
	ca := newCA(t, "replicas")
	l := startLeader(t, ca, 1000, ep)
	f := startFollower(t, ca, ep)
	f.follow(t, l)

	own, err := l.d.Acquire(context.Background(), &sched.Ticket{RawISL: 2000})
	if err != nil {
		t.Fatal(err)
	}
	tk := &sched.Ticket{RawISL: 2000, Model: "m", Priority: 3, HasPriority: true}
	ch := acquireAsync(context.Background(), f.c, tk)
	waitQueued(t, l.d, 1)
	if s, _ := f.d.Snapshot(); s.Queued != 0 {
		t.Fatalf("the follower's own queue holds %d requests", s.Queued)
	}
	own.Done()
	r := receive(t, ch, "the ticket's grant")
	if r.err != nil || r.g == nil || r.g.Endpoints[0] != ep {
		t.Fatalf("ticket: %+v", r)
	}
	if tk.Priority != 3 || tk.Waited <= 0 {
		t.Errorf("the routed ticket: priority %d (the leader's effective one, want 3), waited %v", tk.Priority, tk.Waited)
	}
	waitInFlight(t, l.d, 1)
	r.g.FirstByte()
	r.g.Done()
	waitInFlight(t, l.d, 0)
	if got := f.routes(routeForwarded); got != 1 {
		t.Errorf("forwarded %v, want 1", got)
	}
}

// TestLeaderReplyPassesThrough: a ticket the leader refuses with a 429
// gets that very answer at the follower.
func TestLeaderReplyPassesThrough(t *testing.T) {
	ca := newCA(t, "replicas")
	l := startLeader(t, ca, 1, ep)
	f := startFollower(t, ca, ep)
	f.follow(t, l)
	if _, err := l.d.Acquire(context.Background(), &sched.Ticket{RawISL: 2000}); err != nil {
		t.Fatal(err)
	}
	queued := acquireAsync(context.Background(), l.d, &sched.Ticket{RawISL: 10})
	waitQueued(t, l.d, 1)
	_, err := f.c.Acquire(context.Background(), &sched.Ticket{RawISL: 10})
	var r *extproc.Reply
	if !errors.As(err, &r) || r.Status != 429 || r.Reason != "queue_limit" || r.RetryAfter != 3*time.Second || !strings.Contains(string(r.Body), "lane") {
		t.Fatalf("the follower's answer: %v, want the leader's 429 queue_limit", err)
	}
	select {
	case <-queued:
		t.Fatal("the leader's queued request was answered")
	default:
	}
}

// TestRefusedTicketIsDecidedHere: a leader whose gate is closed (not
// ready, shutting down) decides nothing: the follower decides the ticket
// itself, once.
func TestRefusedTicketIsDecidedHere(t *testing.T) {
	ca := newCA(t, "replicas")
	l := startLeader(t, ca, 1000, ep)
	f := startFollower(t, ca, ep)
	f.follow(t, l)
	reason := "not_ready"
	l.gate.Store(&reason)
	g, err := f.c.Acquire(context.Background(), &sched.Ticket{RawISL: 10})
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := f.d.Snapshot(); s.Endpoints[0].InFlight != 1 {
		t.Fatalf("the follower's own dispatcher holds %d grants, want 1", s.Endpoints[0].InFlight)
	}
	g.Done()
	if got := f.routes(routeFallback); got != 1 {
		t.Errorf("fallback %v, want 1", got)
	}
}

// TestBrokenLinkReoffersWaitingTickets: the leader goes away with a
// follower's ticket in its queue; the follower offers it again here with
// its original arrival, and it is answered once.
func TestBrokenLinkReoffersWaitingTickets(t *testing.T) {
	ca := newCA(t, "replicas")
	l := startLeader(t, ca, 1000, ep)
	f := startFollower(t, ca, ep)
	f.follow(t, l)
	if _, err := l.d.Acquire(context.Background(), &sched.Ticket{RawISL: 2000}); err != nil {
		t.Fatal(err)
	}
	tk := &sched.Ticket{RawISL: 10}
	queuedAt := time.Now()
	ch := acquireAsync(context.Background(), f.c, tk)
	waitQueued(t, l.d, 1)
	t0 := time.Now()
	l.srv.Stop() // the leader's process dies: its connections close
	r := receive(t, ch, "the re-offered ticket")
	if r.err != nil || r.g == nil {
		t.Fatalf("re-offered ticket: %+v", r)
	}
	if tk.Waited < t0.Sub(queuedAt) {
		t.Errorf("re-offered with Waited %v: its arrival was not kept", tk.Waited)
	}
	if s, _ := f.d.Snapshot(); s.Endpoints[0].InFlight != 1 {
		t.Fatalf("the follower's dispatcher holds %d grants, want the re-offered one", s.Endpoints[0].InFlight)
	}
	r.g.Done()
	waitQueued(t, l.d, 0) // the leader's side of the link took its ticket back
	if got := f.routes(routeFallback); got != 1 {
		t.Errorf("fallback %v, want 1", got)
	}
	select {
	case r := <-ch:
		t.Fatalf("answered twice: %+v", r)
	default:
	}
}

// TestFollowerGoneGivesEverythingBack: a follower's link ends with a
// grant running and a ticket queued: the leader gives the grant back and
// takes the ticket out of its queue.
func TestFollowerGoneGivesEverythingBack(t *testing.T) {
	ca := newCA(t, "replicas")
	l := startLeader(t, ca, 1000, ep)
	f := startFollower(t, ca, ep)
	f.follow(t, l)
	g, err := f.c.Acquire(context.Background(), &sched.Ticket{RawISL: 2000})
	if err != nil {
		t.Fatal(err)
	}
	waitInFlight(t, l.d, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	acquireAsync(ctx, f.c, &sched.Ticket{RawISL: 10})
	waitQueued(t, l.d, 1)
	f.c.Close() // the follower crashes
	waitQueued(t, l.d, 0)
	waitInFlight(t, l.d, 0)
	g.Done() // its events go nowhere now
	if got := testutil.ToFloat64(l.ts.outcomes[ticketLost]); got != 1 {
		t.Errorf("lost grants %v, want 1", got)
	}
}

// TestCancelledTicketLeavesTheLeadersQueue: the follower's caller gives
// up while its ticket is queued at the leader: the leader drops it.
func TestCancelledTicketLeavesTheLeadersQueue(t *testing.T) {
	ca := newCA(t, "replicas")
	l := startLeader(t, ca, 1000, ep)
	f := startFollower(t, ca, ep)
	f.follow(t, l)
	own, err := l.d.Acquire(context.Background(), &sched.Ticket{RawISL: 2000})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch := acquireAsync(ctx, f.c, &sched.Ticket{RawISL: 2000})
	waitQueued(t, l.d, 1)
	cancel()
	if r := receive(t, ch, "the cancelled ticket"); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled ticket: %+v", r)
	}
	waitQueued(t, l.d, 0)
	own.Done()
	waitInFlight(t, l.d, 0) // nothing was granted to the cancelled ticket
}

// TestVersionMismatchRefused: a leader and a follower of different
// protocol versions refuse each other, each with a log line naming both
// versions; the follower decides here.
func TestVersionMismatchRefused(t *testing.T) {
	ca := newCA(t, "replicas")
	l := startLeader(t, ca, 1000, ep)

	// A follower of version 99 at this leader.
	_, peers := replicaDir(t, ca)
	addr, _, _ := parseHolder(l.holder)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(peers.Client())))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := replica.OpenLink(context.Background(), conn)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.SendMsg(&replica.Frame{Hello: &replica.Hello{Version: 99, Identity: "future"}}); err != nil {
		t.Fatal(err)
	}
	var fr replica.Frame
	if err := stream.RecvMsg(&fr); err != nil || fr.Hello == nil || fr.Hello.Version != replica.Version {
		t.Fatalf("the leader's hello: %+v, %v", fr.Hello, err)
	}
	if err := stream.RecvMsg(&fr); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("after the hellos: %v, want FailedPrecondition", err)
	}
	if !l.logs.has("another replica protocol version") || !l.logs.has(`"followerVersion"=99`) {
		t.Errorf("the leader's log does not say which versions met: %q", l.logs.lines)
	}

	// A leader of version 99 for this follower.
	old := startFuture(t, ca)
	f := startFollower(t, ca, ep)
	f.view.set(old)
	f.c.linkTo(old)
	f.c.mu.Lock()
	lk := f.c.links[old]
	f.c.mu.Unlock()
	<-lk.broken
	if !strings.Contains(lk.err.Error(), "version 99") || !f.logs.has("refused the link") {
		t.Errorf("the follower's link ended with %v; log %q", lk.err, f.logs.lines)
	}
	g, err := f.c.Acquire(context.Background(), &sched.Ticket{RawISL: 10})
	if err != nil {
		t.Fatal(err)
	}
	g.Done()
	if got := f.routes(routeLocal); got != 1 {
		t.Errorf("local %v, want 1", got)
	}
}

// startFuture serves a link that says hello as version 99 and returns
// its holder identity.
func startFuture(t *testing.T, ca *tlsutil.CA) string {
	t.Helper()
	_, peers := replicaDir(t, ca)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(peers.ServerOptions()...)
	replica.Register(srv, futureLeader{})
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return holderIdentity("future", ln.Addr().String(), "0c")
}

type futureLeader struct{}

func (futureLeader) Link(stream grpc.ServerStream) error {
	var f replica.Frame
	if err := stream.RecvMsg(&f); err != nil {
		return err
	}
	if err := stream.SendMsg(&replica.Frame{Hello: &replica.Hello{Version: 99}}); err != nil {
		return err
	}
	return stream.RecvMsg(&f) // until the follower gives up
}
