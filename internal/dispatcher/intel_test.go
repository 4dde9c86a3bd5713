package dispatcher

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/pkg/drr"
	"github.com/laneway-dev/laneway/pkg/podmetrics"
	"github.com/laneway-dev/laneway/pkg/policy"
	"github.com/laneway-dev/laneway/pkg/sched"
	"github.com/laneway-dev/laneway/pkg/sched/schedtest"
)

// oneClass is one fcfs class with a busy threshold (or none when 0).
func oneClass(threshold uint64) *sched.Policy {
	rule := policy.BusyTest{}
	if threshold > 0 {
		rule = policy.BusyTest{Threshold: threshold, HasThreshold: true}
	}
	return &sched.Policy{
		Classes: []drr.ClassConfig{{Name: "standard", Quantum: 1, Policy: drr.FCFS, Queueing: threshold > 0,
			RequestLimitPerWorker: drr.NoLimit, RawISLLimitPerWorker: drr.NoLimit, CachedLimitPerWorker: drr.NoLimit}},
		Busy:    []policy.BusyTest{rule},
		Resolve: func(*sched.Ticket) int { return 0 },
	}
}

func startWith(t *testing.T, p *sched.Policy, o Options, eps ...sched.Endpoint) *Dispatcher {
	t.Helper()
	d, err := New(p, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go d.Run(ctx)
	t.Cleanup(func() { cancel(); <-d.done })
	d.SetEndpoints(eps)
	return d
}

func mustAcquire(t *testing.T, d *Dispatcher, tk *sched.Ticket) *sched.Grant {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g, err := d.Acquire(ctx, tk)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	return g
}

func eps(addrs ...string) []sched.Endpoint {
	var out []sched.Endpoint
	for _, a := range addrs {
		out = append(out, sched.Endpoint{Addr: a, MaxBatchedTokens: 8192})
	}
	return out
}

func TestPrefixSnapshotAndAffinity(t *testing.T) {
	rec := &schedtest.Recorder{Inner: sched.NewCostChooser(1, 1)}
	d := startWith(t, oneClass(0), Options{Options: sched.Options{Chooser: rec, Prefix: &sched.PrefixOptions{}}},
		eps("127.0.0.2:1", "127.0.0.3:1", "127.0.0.4:1")...)

	first := schedtest.Ticket().Prompt(1000).Shared(1000).Obj()
	g := mustAcquire(t, d, first)
	if first.Cached != 0 {
		t.Fatalf("first sight of a prompt: Cached = %d, want 0", first.Cached)
	}
	home := g.Endpoints[0]
	g.FirstByte()
	g.Done()

	// The same prompt again: 62 full blocks are cacheable ((1000-1)/16),
	// and the endpoint that has them wins.
	again := schedtest.Ticket().Prompt(1000).Shared(1000).Obj()
	g = mustAcquire(t, d, again)
	if again.Cached != 62*16 {
		t.Errorf("repeat: Cached = %d, want %d", again.Cached, 62*16)
	}
	if g.Endpoints[0] != home {
		t.Errorf("repeat went to %s, want %s which served it before", g.Endpoints[0], home)
	}
	cands := rec.Last(t)
	if c := cands[home]; c.CachedTokens != 62*16 {
		t.Errorf("candidate %s CachedTokens = %d, want %d", home, c.CachedTokens, 62*16)
	}
	for addr, c := range cands {
		if addr != home && c.CachedTokens != 0 {
			t.Errorf("candidate %s CachedTokens = %d, want 0", addr, c.CachedTokens)
		}
	}
	g.Done()

	// A prompt sharing its first 480 tokens (30 blocks).
	shared := schedtest.Ticket().Prompt(2000).Shared(480).Seed(2).Obj()
	g = mustAcquire(t, d, shared)
	if shared.Cached != 30*16 || g.Endpoints[0] != home {
		t.Errorf("shared prefix: Cached = %d on %s, want %d on %s", shared.Cached, g.Endpoints[0], 30*16, home)
	}
	g.Done()

	// Pinned elsewhere: the snapshot is the pinned endpoint's (nothing).
	other := "127.0.0.2:1"
	if other == home {
		other = "127.0.0.3:1"
	}
	pinned := schedtest.Ticket().Prompt(1000).Shared(1000).Obj()
	pinned.Allow, pinned.HasAllow = []string{other}, true
	g = mustAcquire(t, d, pinned)
	if pinned.Cached != 0 || g.Endpoints[0] != other {
		t.Errorf("pinned to %s: Cached = %d on %s, want 0 on the pinned endpoint", other, pinned.Cached, g.Endpoints[0])
	}
	g.Done()
}

// TestPrefixAffinityYieldsToLoad: the cached endpoint loses once its load
// costs more than the prefill the cache saves.
func TestPrefixAffinityYieldsToLoad(t *testing.T) {
	start := func() *Dispatcher {
		return startWith(t, oneClass(0), Options{Options: sched.Options{Chooser: sched.NewCostChooser(1, 1), Prefix: &sched.PrefixOptions{}}},
			eps("127.0.0.2:1", "127.0.0.3:1")...)
	}
	repeat := func() *sched.Ticket { return schedtest.Ticket().Prompt(1600).Shared(1600).Obj() }

	// While the first is in prefill (100 blocks), a repeat costs 1 + 100
	// at home and 100 elsewhere: waiting for that prefill is no better than
	// doing it again.
	d := start()
	g := mustAcquire(t, d, repeat())
	home := g.Endpoints[0]
	if g2 := mustAcquire(t, d, repeat()); g2.Endpoints[0] == home {
		t.Fatalf("repeat during the first prefill went home %s (cost 101 vs 100)", home)
	}

	// Once it decodes, a repeat costs 1 + 1 at home.
	d = start()
	g = mustAcquire(t, d, repeat())
	home = g.Endpoints[0]
	g.FirstByte()
	g3 := mustAcquire(t, d, repeat())
	if g3.Endpoints[0] != home {
		t.Fatalf("repeat went to %s, want home %s (cost 2 vs 100)", g3.Endpoints[0], home)
	}
	g3.Done()
	// An unrelated 3200-token prefill pinned at home outweighs the cache.
	big := schedtest.Ticket().Prompt(3200).Seed(5).Obj()
	big.Allow, big.HasAllow = []string{home}, true
	mustAcquire(t, d, big)
	if g4 := mustAcquire(t, d, repeat()); g4.Endpoints[0] == home {
		t.Fatalf("repeat went home %s behind 200 blocks of prefill", home)
	}
}

func TestCachedTokensPickTheBucket(t *testing.T) {
	// Two classes by uncached tokens: < 500 -> "small" (index 0), else
	// "large".
	p := oneClass(0)
	p.Classes = append(p.Classes, drr.ClassConfig{Name: "large", Quantum: 1, Policy: drr.FCFS,
		RequestLimitPerWorker: drr.NoLimit, RawISLLimitPerWorker: drr.NoLimit, CachedLimitPerWorker: drr.NoLimit})
	p.Classes[0].Name = "small"
	p.Busy = append(p.Busy, policy.BusyTest{})
	p.Resolve = func(t *sched.Ticket) int {
		if t.Uncached() < 500 {
			return 0
		}
		return 1
	}
	d := startWith(t, p, Options{Options: sched.Options{Prefix: &sched.PrefixOptions{}}}, eps("127.0.0.2:1")...)
	a := schedtest.Ticket().Prompt(1000).Shared(1000).Obj()
	mustAcquire(t, d, a).Done()
	if a.Class != 1 {
		t.Fatalf("cold prompt class %d, want large", a.Class)
	}
	b := schedtest.Ticket().Prompt(1000).Shared(1000).Obj()
	mustAcquire(t, d, b).Done()
	if b.Class != 0 || b.Uncached() != 1000-62*16 {
		t.Fatalf("warm prompt class %d with %d uncached, want small with %d", b.Class, b.Uncached(), 1000-62*16)
	}
}

func TestStaleAndUnseenLoadHoldRequests(t *testing.T) {
	ep := "127.0.0.2:1"
	d := startWith(t, oneClass(1536), Options{Options: sched.Options{ExpectMetrics: true}}, eps(ep)...)
	ctx := context.Background()

	// Not scraped yet: busy, so a queueing class holds the request.
	ch := acquireAsync(ctx, d, &sched.Ticket{RawISL: 100})
	waitQueued(t, d, 1)
	snap, _ := d.Snapshot()
	if !snap.Endpoints[0].Stale {
		t.Fatalf("endpoint before its first scrape: %+v, want stale", snap.Endpoints[0])
	}
	d.SetEndpointMetrics(ep, podmetrics.Metrics{Known: podmetrics.Waiting | podmetrics.Running}, false)
	r := <-ch
	if r.err != nil {
		t.Fatalf("after fresh metrics: %v", r.err)
	}
	r.g.FirstByte()
	r.g.Done()
	// A delivery after it finished: the engine's queue can no longer hold
	// it.
	d.SetEndpointMetrics(ep, podmetrics.Metrics{Known: podmetrics.Waiting | podmetrics.Running}, false)

	// Two requests waiting in the engine that we did not send, at the seed
	// estimate of 1024 tokens, exceed 1536: busy.
	d.SetEndpointMetrics(ep, podmetrics.Metrics{Known: podmetrics.Waiting | podmetrics.Running, Waiting: 2, Running: 4}, false)
	ch = acquireAsync(ctx, d, &sched.Ticket{RawISL: 100})
	waitQueued(t, d, 1)
	snap, _ = d.Snapshot()
	if e := snap.Endpoints[0]; e.UnseenWaiting != 2 || e.UnseenPrefill < 1536 {
		t.Fatalf("endpoint %+v: want 2 unseen waiting counted past 1536 tokens", e)
	}
	d.SetEndpointMetrics(ep, podmetrics.Metrics{Known: podmetrics.Waiting | podmetrics.Running, Running: 4}, false)
	r = <-ch
	if r.err != nil {
		t.Fatalf("after the engine queue emptied: %v", r.err)
	}

	// Our own request waiting in the engine is not unseen load, even when
	// it finishes before the scrape that saw it is delivered.
	d.SetEndpointMetrics(ep, podmetrics.Metrics{Known: podmetrics.Waiting | podmetrics.Running, Waiting: 1}, false)
	snap, _ = d.Snapshot()
	if e := snap.Endpoints[0]; e.UnseenWaiting != 0 {
		t.Fatalf("our in-flight request counted as unseen: %+v", e)
	}
	r.g.FirstByte() // it finished: its first byte was reported
	r.g.Done()
	d.SetEndpointMetrics(ep, podmetrics.Metrics{Known: podmetrics.Waiting | podmetrics.Running, Waiting: 1}, false)
	snap, _ = d.Snapshot()
	if e := snap.Endpoints[0]; e.UnseenWaiting != 0 {
		t.Fatalf("a request that finished after the scrape counted as unseen: %+v", e)
	}
	// The next delivery forgets it: one waiting is now a stranger.
	d.SetEndpointMetrics(ep, podmetrics.Metrics{Known: podmetrics.Waiting | podmetrics.Running, Waiting: 1}, false)
	snap, _ = d.Snapshot()
	if e := snap.Endpoints[0]; e.UnseenWaiting != 1 {
		t.Fatalf("endpoint %+v: want 1 unseen waiting", e)
	}

	// Stale again: busy until fresh.
	d.SetEndpointMetrics(ep, podmetrics.Metrics{}, true)
	ch = acquireAsync(ctx, d, &sched.Ticket{RawISL: 100})
	waitQueued(t, d, 1)
	d.SetEndpointMetrics(ep, podmetrics.Metrics{Known: podmetrics.Waiting | podmetrics.Running}, false)
	if r = <-ch; r.err != nil {
		t.Fatalf("after recovery: %v", r.err)
	}
	r.g.Done()
	// Unknown addresses are ignored.
	d.SetEndpointMetrics("127.0.0.9:9", podmetrics.Metrics{}, true)
}

func TestStaleRankedLastAndCandidateLoad(t *testing.T) {
	rec := &schedtest.Recorder{Inner: sched.NewCostChooser(3, 1)}
	a, b, c := "127.0.0.2:1", "127.0.0.3:1", "127.0.0.4:1"
	d := startWith(t, oneClass(0), Options{Options: sched.Options{Chooser: rec, ExpectMetrics: true, MaxFallbacks: 2}}, eps(a, b, c)...)
	full := podmetrics.Waiting | podmetrics.Running | podmetrics.KVCacheUsage | podmetrics.BlockSize | podmetrics.NumBlocks
	d.SetEndpointMetrics(a, podmetrics.Metrics{Known: full, Running: 5, BlockSize: 16, NumBlocks: 1000}, false)
	d.SetEndpointMetrics(b, podmetrics.Metrics{Known: full, BlockSize: 32, NumBlocks: 1000}, false)
	// c is never scraped: stale, so last even though a is loaded.
	g := mustAcquire(t, d, &sched.Ticket{RawISL: 64})
	if !slices.Equal(g.Endpoints, []string{b, a, c}) {
		t.Fatalf("order %v, want [b a c]: a runs 5 sequences, c is stale", g.Endpoints)
	}
	cands := rec.Last(t)
	if got := cands[a].Decoding; got != 5 {
		t.Errorf("a Decoding %d, want the engine's 5 running", got)
	}
	if !cands[c].Stale || !cands[c].Busy || cands[a].Stale {
		t.Errorf("candidates %+v: want only c stale (and busy)", cands)
	}
	if bs := d.BlockSize(); bs != 32 {
		t.Errorf("BlockSize() = %d, want the largest reported (32)", bs)
	}
	// Our own request past its first byte decodes there.
	g.FirstByte()
	mustAcquire(t, d, &sched.Ticket{RawISL: 64}).Done()
	if got := rec.Last(t)[b].Decoding; got != 1 {
		t.Errorf("b Decoding %d while our request decodes there, want 1", got)
	}
	g.Done()
	d.SetEndpoints(eps(a))
	d.Snapshot() // the loop has applied the removal
	if bs := d.BlockSize(); bs != sched.DefaultBlockSize {
		t.Errorf("BlockSize() = %d after b left, want %d", bs, sched.DefaultBlockSize)
	}
}

func TestOnEndpointsAndEngines(t *testing.T) {
	var got [][]sched.Endpoint
	var mu sync.Mutex
	d := startWith(t, oneClass(0), Options{Options: sched.Options{DefaultEngine: policy.EngineSGLang}, OnEndpoints: func(e []sched.Endpoint) {
		mu.Lock()
		got = append(got, e)
		mu.Unlock()
	}}, sched.Endpoint{Addr: "127.0.0.2:1"}, sched.Endpoint{Addr: "127.0.0.3:1", Engine: "vllm"}, sched.Endpoint{Addr: "127.0.0.4:1", Engine: "tgi"})
	mu.Lock()
	if len(got) != 1 || len(got[0]) != 3 {
		t.Fatalf("OnEndpoints saw %v, want one set of 3", got)
	}
	mu.Unlock()
	cases := []struct {
		addr string
		want policy.Engine
	}{{"127.0.0.2:1", policy.EngineSGLang}, {"127.0.0.3:1", policy.EngineVLLM}, {"127.0.0.4:1", policy.EngineSGLang}}
	for _, tc := range cases {
		g := mustAcquire(t, d, &sched.Ticket{RawISL: 1, Allow: []string{tc.addr}, HasAllow: true})
		if g.Engine != tc.want {
			t.Errorf("grant on %s: engine %v, want %v", tc.addr, g.Engine, tc.want)
		}
		g.Done()
	}
}
