package dispatcher

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/pkg/drr"
	"github.com/laneway-dev/laneway/pkg/policy"
	"github.com/laneway-dev/laneway/pkg/sched"
)

// twoClassPolicy is the premium/regular policy of SPEC §11 with the given
// quanta; the class header names the class, anything else is regular.
func twoClassPolicy(premiumQ, regularQ uint64, limit uint64) *sched.Policy {
	cls := []drr.ClassConfig{
		{Name: "premium", Quantum: premiumQ, Policy: drr.FCFS, Queueing: true,
			RequestLimitPerWorker: limit, RawISLLimitPerWorker: drr.NoLimit, CachedLimitPerWorker: drr.NoLimit},
		{Name: "regular", Quantum: regularQ, Policy: drr.FCFS, Queueing: true,
			RequestLimitPerWorker: limit, RawISLLimitPerWorker: drr.NoLimit, CachedLimitPerWorker: drr.NoLimit},
	}
	rule := policy.BusyTest{Threshold: 1536, HasThreshold: true}
	return &sched.Policy{
		Classes: cls,
		Busy:    []policy.BusyTest{rule, rule},
		Resolve: func(t *sched.Ticket) int {
			if t.ClassHeader == "premium" {
				return 0
			}
			return 1
		},
	}
}

func startDispatcher(t *testing.T, p *sched.Policy, eps ...string) *Dispatcher {
	t.Helper()
	d, err := New(p, Options{Options: sched.Options{MaxFallbacks: 1}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go d.Run(ctx)
	t.Cleanup(func() { cancel(); <-d.done })
	var list []sched.Endpoint
	for _, e := range eps {
		list = append(list, sched.Endpoint{Addr: e, MaxBatchedTokens: 8192})
	}
	d.SetEndpoints(list)
	return d
}

// acquireAsync starts an Acquire and returns the channel its result lands on.
func acquireAsync(ctx context.Context, d *Dispatcher, tk *sched.Ticket) <-chan result {
	ch := make(chan result, 1)
	go func() {
		g, err := d.Acquire(ctx, tk)
		ch <- result{g, err}
	}()
	return ch
}

// waitQueued blocks until the dispatcher reports n queued requests.
func waitQueued(t *testing.T, d *Dispatcher, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s, _ := d.Snapshot()
		if s.Queued == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queued = %d, want %d", s.Queued, n)
		}
		time.Sleep(time.Millisecond) // polling: the queue has no event to await from outside
	}
}

func TestDirectPickPrefersLeastActivePrefill(t *testing.T) {
	d := startDispatcher(t, twoClassPolicy(512, 128, 1024), "127.0.0.2:8000", "127.0.0.3:8000")
	ctx := context.Background()
	g1, err := d.Acquire(ctx, &sched.Ticket{ClassHeader: "premium", RawISL: 1000})
	if err != nil {
		t.Fatal(err)
	}
	g2, err := d.Acquire(ctx, &sched.Ticket{ClassHeader: "premium", RawISL: 10})
	if err != nil {
		t.Fatal(err)
	}
	if g1.Endpoints[0] == g2.Endpoints[0] {
		t.Fatalf("both picks went to %s; want the idle endpoint second", g1.Endpoints[0])
	}
	if len(g1.Endpoints) != 2 {
		t.Fatalf("fallbacks = %v, want pick + 1 fallback", g1.Endpoints)
	}
	s, _ := d.Snapshot()
	var total uint64
	for _, e := range s.Endpoints {
		total += e.ActivePrefill
	}
	if total != 1010 {
		t.Fatalf("active prefill = %d, want 1010", total)
	}
	g1.Done()
	g2.Done()
	s, _ = d.Snapshot()
	for _, e := range s.Endpoints {
		if e.ActivePrefill != 0 || e.InFlight != 0 {
			t.Fatalf("endpoint %s not released: %+v", e.Addr, e)
		}
	}
}

func TestQueuedRequestReleasedOnFirstByte(t *testing.T) {
	d := startDispatcher(t, twoClassPolicy(512, 128, 1024), "127.0.0.2:8000")
	ctx := context.Background()
	// 4 × 512 tokens: the fourth pushes active prefill to 2048 > 1536.
	var grants []*sched.Grant
	for i := 0; i < 4; i++ {
		g, err := d.Acquire(ctx, &sched.Ticket{ClassHeader: "premium", RawISL: 512})
		if err != nil {
			t.Fatal(err)
		}
		grants = append(grants, g)
	}
	ch := acquireAsync(ctx, d, &sched.Ticket{ClassHeader: "regular", RawISL: 512})
	waitQueued(t, d, 1)
	select {
	case r := <-ch:
		t.Fatalf("released while the endpoint is busy: %+v", r)
	default:
	}
	grants[0].FirstByte()
	r := <-ch
	if r.err != nil || r.g.Endpoints[0] != "127.0.0.2:8000" {
		t.Fatalf("got %+v, want a grant on 127.0.0.2:8000", r)
	}
}

// TestReleasesReachTheNextAdmission: with nothing queued, a grant's
// releases do not wake the loop, yet the next request's busy test and every
// snapshot already count them.
func TestReleasesReachTheNextAdmission(t *testing.T) {
	d := startDispatcher(t, twoClassPolicy(512, 128, 1024), "127.0.0.2:8000")
	ctx := context.Background()
	var grants []*sched.Grant
	for i := 0; i < 4; i++ { // 2,048 tokens: busy past 1,536
		grants = append(grants, mustAcquire(t, d, &sched.Ticket{ClassHeader: "premium", RawISL: 512}))
	}
	grants[0].FirstByte()
	grants[1].Done()
	s, _ := d.Snapshot()
	if e := s.Endpoints[0]; e.ActivePrefill != 1024 || e.InFlight != 3 {
		t.Fatalf("after one first byte and one done: %+v, want 1024 active prefill tokens and 3 in flight", e)
	}
	grants[2].FirstByte()
	// 512 tokens active: the next request must go at once, not queue.
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	g, err := d.Acquire(cctx, &sched.Ticket{ClassHeader: "regular", RawISL: 512})
	if err != nil {
		t.Fatalf("Acquire after the releases: %v", err)
	}
	s, _ = d.Snapshot()
	if e := s.Endpoints[0]; e.ActivePrefill != 1024 || e.InFlight != 4 || s.Queued != 0 {
		t.Fatalf("after the new grant: %+v, queued %d; want 1024 tokens, 4 in flight, none queued", e, s.Queued)
	}
	for _, g := range append(grants, g) {
		g.Done()
	}
	s, _ = d.Snapshot()
	if e := s.Endpoints[0]; e.ActivePrefill != 0 || e.InFlight != 0 {
		t.Fatalf("after every done: %+v, want nothing active", e)
	}
}

// TestNoLostWakeUps races releases against requests that queue behind
// them: a release posted while the loop decides to queue must still let
// the queued request go. A lost wake-up leaves a request queued forever,
// which the deadline turns into a failure.
func TestNoLostWakeUps(t *testing.T) {
	d := startDispatcher(t, twoClassPolicy(512, 128, 1<<20), "127.0.0.2:8000")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const workers, rounds = 8, 300
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		go func() {
			for i := 0; i < rounds; i++ {
				g, err := d.Acquire(ctx, &sched.Ticket{ClassHeader: "premium", RawISL: 512})
				if err != nil {
					errs <- err
					return
				}
				g.FirstByte()
				g.Done()
			}
			errs <- nil
		}()
	}
	for w := 0; w < workers; w++ {
		if err := <-errs; err != nil {
			t.Fatalf("a worker's Acquire failed (a lost wake-up ends in the deadline): %v", err)
		}
	}
	s, _ := d.Snapshot()
	if e := s.Endpoints[0]; e.ActivePrefill != 0 || e.InFlight != 0 || s.Queued != 0 {
		t.Fatalf("after all rounds: %+v, queued %d; want nothing left", e, s.Queued)
	}
}

// TestSettleTakesReleasesPostedMeanwhile is the loop's half of the
// wake-up protocol, step by step without a running loop: a release posted
// while the loop was queueing a request (so it saw no queue and woke
// nobody) is applied when the loop settles, and the request goes.
func TestSettleTakesReleasesPostedMeanwhile(t *testing.T) {
	d, err := New(twoClassPolicy(512, 128, 1024), Options{})
	if err != nil {
		t.Fatal(err)
	}
	d.core.SetEndpoints(d.now(), eps("127.0.0.2:8000"))
	admit := func() *waiter { return stepAdmit(d, &sched.Ticket{ClassHeader: "premium", RawISL: 512}) }
	var grants []*sched.Grant
	for i := 0; i < 4; i++ {
		r := <-admit().reply
		if r.err != nil {
			t.Fatal(r.err)
		}
		grants = append(grants, r.g)
	}
	queued := admit()
	if d.core.Len() != 1 {
		t.Fatalf("%d queued, want the fifth request queued behind the busy endpoint", d.core.Len())
	}
	grants[0].FirstByte() // hasQueue is still false: posted without a wake-up
	select {
	case <-d.relWake:
		t.Fatal("a release woke the loop while it published no queue")
	default:
	}
	d.settle()
	select {
	case r := <-queued.reply:
		if r.err != nil {
			t.Fatalf("queued request answered %v, want a grant", r.err)
		}
	default:
		t.Fatal("settle left the queued request waiting with its release in the mailbox")
	}
	if d.hasQueue.Load() {
		t.Error("hasQueue still set with an empty queue")
	}
}

func TestCancelledWhileQueuedLeavesAtOnce(t *testing.T) {
	d := startDispatcher(t, twoClassPolicy(512, 128, 1024), "127.0.0.2:8000")
	ctx := context.Background()
	busy, err := d.Acquire(ctx, &sched.Ticket{ClassHeader: "premium", RawISL: 4000})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	ch := acquireAsync(cctx, d, &sched.Ticket{ClassHeader: "premium", RawISL: 512})
	waitQueued(t, d, 1)
	cancel()
	if r := <-ch; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("got %+v, want context.Canceled", r)
	}
	waitQueued(t, d, 0)
	busy.Done()
	s, _ := d.Snapshot()
	if e := s.Endpoints[0]; e.InFlight != 0 || e.ActivePrefill != 0 {
		t.Fatalf("the cancelled request was dispatched: %+v", e)
	}
}

func TestQueueLimitRejects(t *testing.T) {
	d := startDispatcher(t, twoClassPolicy(512, 128, 1), "127.0.0.2:8000")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := d.Acquire(ctx, &sched.Ticket{ClassHeader: "regular", RawISL: 4000}); err != nil {
		t.Fatal(err)
	}
	acquireAsync(ctx, d, &sched.Ticket{ClassHeader: "regular", RawISL: 10})
	waitQueued(t, d, 1)
	_, err := d.Acquire(ctx, &sched.Ticket{ClassHeader: "regular", RawISL: 10})
	var rej *drr.Rejection
	if !errors.As(err, &rej) {
		t.Fatalf("err = %v, want *drr.Rejection", err)
	}
	want := drr.Rejection{Class: "regular", Kind: drr.LimitRequests, Current: 1, Limit: 1}
	if *rej != want {
		t.Fatalf("rejection = %+v, want %+v", *rej, want)
	}
}

func TestPinnedRequestOfRemovedEndpointGets503(t *testing.T) {
	d := startDispatcher(t, twoClassPolicy(512, 128, 1024), "127.0.0.2:8000", "127.0.0.3:8000")
	ctx := context.Background()
	for _, ep := range []string{"127.0.0.2:8000", "127.0.0.3:8000"} {
		if _, err := d.Acquire(ctx, &sched.Ticket{ClassHeader: "premium", RawISL: 4000, HasAllow: true, Allow: []string{ep}}); err != nil {
			t.Fatal(err)
		}
	}
	pinned := acquireAsync(ctx, d, &sched.Ticket{ClassHeader: "premium", RawISL: 10, HasAllow: true, Allow: []string{"127.0.0.2:8000"}})
	shared := acquireAsync(ctx, d, &sched.Ticket{ClassHeader: "regular", RawISL: 10})
	waitQueued(t, d, 2)
	d.SetEndpoints([]sched.Endpoint{{Addr: "127.0.0.3:8000"}})
	r := <-pinned
	var ne *sched.NoEndpointError
	if !errors.As(r.err, &ne) {
		t.Fatalf("pinned: got %+v, want sched.NoEndpointError", r)
	}
	waitQueued(t, d, 1) // the shared request stays queued behind busy .3
	select {
	case r := <-shared:
		t.Fatalf("shared request answered early: %+v", r)
	default:
	}
}

func TestEmptySubsetHintIs503(t *testing.T) {
	d := startDispatcher(t, twoClassPolicy(512, 128, 1024), "127.0.0.2:8000")
	_, err := d.Acquire(context.Background(), &sched.Ticket{HasAllow: true})
	var ne *sched.NoEndpointError
	if !errors.As(err, &ne) {
		t.Fatalf("err = %v, want sched.NoEndpointError", err)
	}
}

func TestNoEndpointsIs503(t *testing.T) {
	d := startDispatcher(t, twoClassPolicy(512, 128, 1024))
	_, err := d.Acquire(context.Background(), &sched.Ticket{RawISL: 5})
	var ne *sched.NoEndpointError
	if !errors.As(err, &ne) {
		t.Fatalf("err = %v, want sched.NoEndpointError", err)
	}
}

func TestShutdownAnswersEveryQueuedRequest(t *testing.T) {
	d := startDispatcher(t, twoClassPolicy(512, 128, 1024), "127.0.0.2:8000")
	ctx := context.Background()
	if _, err := d.Acquire(ctx, &sched.Ticket{RawISL: 4000}); err != nil {
		t.Fatal(err)
	}
	var chans []<-chan result
	for i := 0; i < 20; i++ {
		chans = append(chans, acquireAsync(ctx, d, &sched.Ticket{RawISL: 10, ClassHeader: []string{"premium", "regular"}[i%2]}))
	}
	waitQueued(t, d, 20)
	d.Shutdown()
	for i, ch := range chans {
		if r := <-ch; !errors.Is(r.err, sched.ErrShuttingDown) {
			t.Fatalf("request %d: got %+v, want sched.ErrShuttingDown", i, r)
		}
	}
	if _, err := d.Acquire(ctx, &sched.Ticket{RawISL: 1}); !errors.Is(err, sched.ErrShuttingDown) {
		t.Fatalf("after shutdown: err = %v", err)
	}
}

func TestPolicySwapKeepsQueuedRequests(t *testing.T) {
	d := startDispatcher(t, twoClassPolicy(512, 128, 1024), "127.0.0.2:8000")
	ctx := context.Background()
	busy, err := d.Acquire(ctx, &sched.Ticket{RawISL: 4000})
	if err != nil {
		t.Fatal(err)
	}
	var chans []<-chan result
	for i := 0; i < 10; i++ {
		chans = append(chans, acquireAsync(ctx, d, &sched.Ticket{RawISL: 100, ClassHeader: "premium"}))
		waitQueued(t, d, i+1)
	}
	// The new policy has a single class: every request moves there.
	one := &sched.Policy{
		Classes: []drr.ClassConfig{{Name: "only", Quantum: 1, Policy: drr.FCFS, Queueing: true,
			RequestLimitPerWorker: drr.NoLimit, RawISLLimitPerWorker: drr.NoLimit, CachedLimitPerWorker: drr.NoLimit}},
		Busy:    []policy.BusyTest{{Threshold: 1536, HasThreshold: true}},
		Resolve: func(*sched.Ticket) int { return 0 },
	}
	if err := d.SetPolicy(one); err != nil {
		t.Fatal(err)
	}
	s, _ := d.Snapshot()
	if s.Queued != 10 || len(s.Classes) != 1 || s.Classes[0].Pending != 10 {
		t.Fatalf("after swap: %+v", s)
	}
	busy.Done()
	for i, ch := range chans {
		if r := <-ch; r.err != nil {
			t.Fatalf("request %d: %v", i, r.err)
		}
	}
}

// TestReleaseTakenByAnotherCommandStillDrains is a lost wake-up the old
// loop had, stepped by hand: a release the loop applied while handling a
// command that does not dispatch (a snapshot) left the queued request
// waiting although its endpoint was free, and the wake-up that release had
// sent then found the mailbox empty. Every loop turn now ends in a drain.
func TestReleaseTakenByAnotherCommandStillDrains(t *testing.T) {
	d, err := New(twoClassPolicy(512, 128, 1024), Options{})
	if err != nil {
		t.Fatal(err)
	}
	d.core.SetEndpoints(d.now(), eps("127.0.0.2:8000"))
	admit := func() *waiter { return stepAdmit(d, &sched.Ticket{ClassHeader: "premium", RawISL: 512}) }
	var grants []*sched.Grant
	for range 4 {
		grants = append(grants, (<-admit().reply).g)
	}
	queued := admit()
	d.settle()            // the loop publishes its queue
	grants[0].FirstByte() // posted with a wake-up
	// One loop turn that picked the snapshot command first:
	var snap sched.Snapshot
	d.takeReleases()
	d.handle(command{fn: func() { snap = d.core.Snapshot() }})
	d.flush()
	select {
	case r := <-queued.reply:
		if r.err != nil {
			t.Fatalf("queued request answered %v, want a grant", r.err)
		}
		r.g.Done()
	default:
		t.Fatalf("queued request still waiting after its endpoint freed (snapshot saw %d queued)", snap.Queued)
	}
	for _, g := range grants {
		g.Done()
	}
}

// stepAdmit is one loop turn that admits t, for tests that step the loop
// by hand instead of running it.
func stepAdmit(d *Dispatcher, t *sched.Ticket) *waiter {
	w := &waiter{reply: make(chan result, 1)}
	w.req.Reset(t, w)
	d.handle(command{w: w})
	d.flush()
	return w
}
