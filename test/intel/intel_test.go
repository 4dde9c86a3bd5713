package intel

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/internal/status"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/internal/testbed/modelsim"
)

// tokens returns n token ids unique to seed (ids stay below 50,000, like a
// real vocabulary's).
func tokens(n int, seed uint64) []int {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	out := make([]int, n)
	for i := range out {
		out[i] = 1 + rng.IntN(49999)
	}
	return out
}

// relaxedStaleness is for tests about something other than staleness: a
// slow scrape on a loaded test machine must not flap an endpoint stale
// (busy, ranked last) under them.
const relaxedStaleness = "--metrics-staleness=5s"

// thresholdPolicy is one explicit fcfs class that queues once an endpoint
// has more than threshold prompt tokens in prefill.
func thresholdPolicy(t *testing.T, threshold int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	yaml := fmt.Sprintf(`policy_classes:
  - name: standard
    queue_policy: fcfs
    quantum: 1
    prefill_busy_threshold: %d
    request_queue_limit_per_worker: 64
`, threshold)
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestRepeatedPromptGoesHome: a long prompt seen before goes back to the
// endpoint that served it while load allows, its cost snapshot carries the
// cached tokens (laneway_routed_cached_tokens_total), and the engine
// really finds that many tokens in its prefix cache. The picker's debug log
// shows the numbers and never the prompt.
func TestRepeatedPromptGoesHome(t *testing.T) {
	var sims []*launch.Sim
	var addrs []string
	for i := range 3 {
		s := startSim(t, fmt.Sprintf("127.0.0.%d", 51+i), "--prefill-tokens-per-sec=400000", "--time-per-output-token=2ms")
		sims = append(sims, s)
		addrs = append(addrs, s.Addr)
	}
	p := startEPP(t, addrs, "--scrape-interval=50ms", relaxedStaleness, "--v=4")
	gw := startGateway(t, p)
	for _, a := range addrs {
		p.Metrics.Await(t, 0, "laneway_endpoint_metrics_stale", "endpoint", a)
	}

	prompt := tokens(4000, 1)
	first := mustPost(t, gw, completion(prompt, 4, nil))
	home := first.endpoint
	if got := p.Metrics.Value(t, "laneway_routed_cached_tokens_total", "endpoint", home); got != 0 {
		t.Fatalf("first sight of the prompt: cached tokens %v on %s, want 0", got, home)
	}
	// Other traffic in between, some of it to other endpoints.
	for i := range 4 {
		mustPost(t, gw, completion(tokens(4000, uint64(100+i)), 4, nil))
	}
	// A text prompt with a marker that must never reach the picker's log.
	mustPost(t, gw, []byte(`{"model":"sim-model","prompt":"zyzzyva-marker `+strings.Repeat("lorem ipsum dolor sit amet ", 50)+`","max_tokens":2}`))

	before := p.Metrics.Value(t, "laneway_routed_cached_tokens_total", "endpoint", home)
	again := mustPost(t, gw, completion(prompt, 4, nil))
	if again.endpoint != home {
		t.Fatalf("repeated prompt went to %s, want %s which served it before", again.endpoint, home)
	}
	// 4000 tokens: (4000-1)/16 = 249 full blocks can be served from cache.
	const wantCached = 249 * 16
	if got := p.Metrics.Value(t, "laneway_routed_cached_tokens_total", "endpoint", home) - before; got != wantCached {
		t.Errorf("snapshot of the repeat: %v cached tokens, want %d", got, wantCached)
	}
	var homeSim *launch.Sim
	for _, s := range sims {
		if s.Addr == home {
			homeSim = s
		}
	}
	recs := records(t, homeSim)
	last := recs[len(recs)-1]
	if last.PromptTokens != 4000 || last.CachedTokens != wantCached {
		t.Errorf("engine record of the repeat: %d prompt tokens, %d cached; want 4000 and %d (the picker's prediction)",
			last.PromptTokens, last.CachedTokens, wantCached)
	}
	logs := p.Log.String()
	if !strings.Contains(logs, fmt.Sprintf(`"cachedTokens"=%d`, wantCached)) && !strings.Contains(logs, fmt.Sprintf(`"cachedTokens":%d`, wantCached)) {
		t.Errorf("debug log has no routed line with cachedTokens %d:\n%s", wantCached, launch.Tail(logs, 4000))
	}
	if strings.Contains(logs, "zyzzyva") || strings.Contains(logs, "lorem") {
		t.Error("prompt text appears in the picker's log")
	}
}

// ttftRun is one run of the shared-prefix workload.
type ttftRun struct {
	meanTTFT     time.Duration
	requests     int
	cachedTokens int
	promptTokens int
}

// runSharedPrefixWorkload starts fresh simulators (cold caches), a picker
// with the given --picker and the gateway, replays the workload and reads
// every request's time to first token from the simulators' records.
func runSharedPrefixWorkload(t *testing.T, picker string, firstIP int) ttftRun {
	t.Helper()
	var sims []*launch.Sim
	var addrs []string
	for i := range 4 {
		s := startSim(t, fmt.Sprintf("127.0.0.%d", firstIP+i),
			"--prefill-tokens-per-sec=100000", "--time-per-output-token=2ms", "--max-num-seqs=8",
			"--num-gpu-blocks=2048", "--max-model-len=4096")
		sims = append(sims, s)
		addrs = append(addrs, s.Addr)
	}
	p := startEPP(t, addrs, "--picker="+picker, "--scrape-interval=50ms", relaxedStaleness)
	gw := startGateway(t, p)
	for _, a := range addrs {
		p.Metrics.Await(t, 0, "laneway_endpoint_metrics_stale", "endpoint", a)
	}

	// 120 requests: 80% share one of 16 system prompts of 2048 tokens (plus
	// 128 tokens of their own), 20% are unique 2176-token prompts. The same
	// sequence in both runs.
	const total, prefixes, workers = 120, 16, 8
	rng := rand.New(rand.NewPCG(42, 42))
	bodies := make([][]byte, total)
	for i := range bodies {
		var prompt []int
		if rng.IntN(10) < 8 {
			prompt = append(tokens(2048, uint64(1000+rng.IntN(prefixes))), tokens(128, uint64(5000+i))...)
		} else {
			prompt = tokens(2176, uint64(9000+i))
		}
		bodies[i] = completion(prompt, 8, nil)
	}
	work := make(chan []byte, total)
	for _, b := range bodies {
		work <- b
	}
	close(work)
	var wg sync.WaitGroup
	errs := make(chan error, total)
	for range workers {
		wg.Go(func() {
			for b := range work {
				ctx, cancel := context.WithTimeout(context.Background(), launch.EventTimeout)
				a := post(ctx, gw, b)
				cancel()
				if a.err != nil || a.status != http.StatusOK {
					errs <- fmt.Errorf("status %d, err %v: %s", a.status, a.err, a.body)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("%s run: %v", picker, err)
	}
	var run ttftRun
	var sum time.Duration
	for _, s := range sims {
		for _, r := range records(t, s) {
			if r.Outcome != "length" || r.FirstToken.IsZero() {
				t.Fatalf("%s run: record %+v did not finish", picker, r)
			}
			sum += r.FirstToken.Sub(r.Arrival)
			run.requests++
			run.cachedTokens += r.CachedTokens
			run.promptTokens += r.PromptTokens
		}
	}
	if run.requests != total {
		t.Fatalf("%s run: simulators recorded %d requests, want %d", picker, run.requests, total)
	}
	run.meanTTFT = sum / time.Duration(run.requests)
	return run
}

// TestPrefixAwareLowersTTFT: with prefix caching in the engines, a
// workload of 80% shared prefixes has a lower mean time to first token
// through the prefix-aware picker than through least-loaded. The figures
// are logged; the assertion is only their order.
func TestPrefixAwareLowersTTFT(t *testing.T) {
	prefix := runSharedPrefixWorkload(t, "prefix", 61)
	least := runSharedPrefixWorkload(t, "least-loaded", 71)
	for _, r := range []struct {
		name string
		run  ttftRun
	}{{"prefix", prefix}, {"least-loaded", least}} {
		t.Logf("%-12s mean TTFT %7.2f ms over %d requests; engine prefix-cache hits %d of %d prompt tokens (%.0f%%)",
			r.name, float64(r.run.meanTTFT.Microseconds())/1000, r.run.requests, r.run.cachedTokens, r.run.promptTokens,
			100*float64(r.run.cachedTokens)/float64(r.run.promptTokens))
	}
	if prefix.meanTTFT >= least.meanTTFT {
		t.Errorf("prefix-aware mean TTFT %v is not below least-loaded's %v", prefix.meanTTFT, least.meanTTFT)
	}
	if prefix.cachedTokens <= least.cachedTokens {
		t.Errorf("prefix-aware cache hits %d tokens, least-loaded %d: want more", prefix.cachedTokens, least.cachedTokens)
	}
}

// TestHungMetricsMakesEndpointBusy: an endpoint whose /metrics page stops
// answering counts as busy within two scrape intervals (its queueing class
// holds requests for it) and serves again once the page answers.
func TestHungMetricsMakesEndpointBusy(t *testing.T) {
	s := startSim(t, "127.0.0.81", "--time-per-output-token=2ms")
	px := startMetricsProxy(t, "127.0.0.82", s)
	const interval = 250 * time.Millisecond
	p := startEPP(t, []string{px.addr}, "--policy-config="+thresholdPolicy(t, 1000), "--scrape-interval="+interval.String())
	gw := startGateway(t, p)
	p.Metrics.Await(t, 0, "laneway_endpoint_metrics_stale", "endpoint", px.addr)
	mustPost(t, gw, completion(tokens(100, 1), 2, nil))

	px.setHang(true)
	hungAt := time.Now()
	p.Metrics.Await(t, 1, "laneway_endpoint_metrics_stale", "endpoint", px.addr)
	took := time.Since(hungAt)
	t.Logf("stale %v after /metrics started hanging (scrape interval %v, bound two intervals)", took.Round(time.Millisecond), interval)
	// The bound is the staleness default, 2 intervals from the last good
	// scrape (which started before the hang); one more interval absorbs
	// the poll and scheduling on a loaded machine.
	if took > 3*interval {
		t.Errorf("stale only %v after the hang; the bound is two scrape intervals (%v)", took, 2*interval)
	}
	ctx, cancel := context.WithTimeout(context.Background(), launch.EventTimeout)
	defer cancel()
	held := postAsync(ctx, gw, completion(tokens(100, 2), 2, nil))
	p.Metrics.Await(t, 1, "dynamo_frontend_router_queue_pending_requests", "policy_class", "standard")
	// The hung scrape times out (at the staleness bound) and counts.
	var scrapeErrors float64
	launch.WaitFor(t, func() string { return fmt.Sprintf("a failed scrape: laneway_scrape_errors_total = %v", scrapeErrors) }, func() bool {
		scrapeErrors = p.Metrics.Value(t, "laneway_scrape_errors_total", "endpoint", px.addr)
		return scrapeErrors >= 1
	})
	select {
	case a := <-held:
		t.Fatalf("request answered while the endpoint's metrics were stale: %d %s", a.status, a.body)
	default:
	}

	px.setHang(false)
	if a := await(t, held); a.err != nil || a.status != http.StatusOK || a.endpoint != px.addr {
		t.Fatalf("held request after recovery: status %d, endpoint %s, err %v: %s", a.status, a.endpoint, a.err, a.body)
	}
	if v := p.Metrics.Value(t, "laneway_endpoint_metrics_stale", "endpoint", px.addr); v != 0 {
		t.Errorf("stale gauge %v after recovery, want 0", v)
	}
}

// TestUnseenLoadHoldsRequests: requests sent to the model server directly
// (behind the picker's back) fill its queue; the picker sees the waiting
// requests in the engine's metrics, counts them as prefill load, and holds
// its own requests until the queue is gone.
func TestUnseenLoadHoldsRequests(t *testing.T) {
	s := startSim(t, "127.0.0.91", "--max-num-seqs=1", "--time-per-output-token=10ms")
	p := startEPP(t, []string{s.Addr}, "--policy-config="+thresholdPolicy(t, 1536), "--scrape-interval=50ms", relaxedStaleness)
	gw := startGateway(t, p)
	p.Metrics.Await(t, 0, "laneway_endpoint_metrics_stale", "endpoint", s.Addr)

	// One request runs for seconds, three wait behind it (one slot).
	direct, stopDirect := context.WithCancel(context.Background())
	defer stopDirect()
	var directAnswers []<-chan answer
	for i := range 4 {
		directAnswers = append(directAnswers, postAsync(direct, "http://"+s.Addr, completion(tokens(200, uint64(10+i)), 2000, nil)))
	}
	p.Metrics.Await(t, 3, "laneway_endpoint_unseen_waiting_requests", "endpoint", s.Addr)

	ctx, cancel := context.WithTimeout(context.Background(), launch.EventTimeout)
	defer cancel()
	held := postAsync(ctx, gw, completion(tokens(100, 1), 1, nil))
	p.Metrics.Await(t, 1, "dynamo_frontend_router_queue_pending_requests", "policy_class", "standard")
	select {
	case a := <-held:
		t.Fatalf("request answered while the engine's queue held 3 strangers: %d %s", a.status, a.body)
	default:
	}

	// The direct clients go away; the engine drops their requests.
	stopDirect()
	for _, ch := range directAnswers {
		if a := await(t, ch); a.err == nil {
			t.Errorf("direct request finished (%d) although its client went away", a.status)
		}
	}
	if a := await(t, held); a.err != nil || a.status != http.StatusOK {
		t.Fatalf("held request after the queue emptied: status %d, err %v: %s", a.status, a.err, a.body)
	}
}

// TestPriorityForwardedToEngine: with --forward-priority the body reaches
// the engine with vLLM's priority (the negated hint), the simulator records
// it, and under contention its priority scheduler runs the more important
// request first; strict_priority is never forwarded.
func TestPriorityForwardedToEngine(t *testing.T) {
	s := startSim(t, "127.0.0.101", "--scheduling-policy=priority", "--max-num-seqs=1", "--time-per-output-token=10ms")
	p := startEPP(t, []string{s.Addr}, "--forward-priority", "--scrape-interval=50ms", relaxedStaleness)
	gw := startGateway(t, p)
	p.Metrics.Await(t, 0, "laneway_endpoint_metrics_stale", "endpoint", s.Addr)
	waitSim := func(name string, want float64) {
		t.Helper()
		s.Metrics.Await(t, want, name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), launch.EventTimeout)
	defer cancel()
	p1, p10 := int32(1), int32(10)
	strict := uint32(5)
	// Prompt lengths tell the requests apart in the simulator's records.
	blocker := postAsync(ctx, gw, completion(tokens(64, 1), 60, nil))
	waitSim("vllm:num_requests_running", 1)
	low := postAsync(ctx, gw, completion(tokens(65, 2), 1, &hints{Priority: &p1}))
	waitSim("vllm:num_requests_waiting", 1)
	strictOnly := postAsync(ctx, gw, completion(tokens(66, 3), 1, &hints{StrictPriority: &strict}))
	waitSim("vllm:num_requests_waiting", 2)
	high := postAsync(ctx, gw, completion(tokens(67, 4), 1, &hints{Priority: &p10}))
	waitSim("vllm:num_requests_waiting", 3)
	for _, ch := range []<-chan answer{blocker, low, strictOnly, high} {
		if a := await(t, ch); a.err != nil || a.status != http.StatusOK {
			t.Fatalf("status %d, err %v: %s", a.status, a.err, a.body)
		}
	}
	byLen := map[int]modelsim.Record{}
	for _, r := range records(t, s) {
		byLen[r.PromptTokens] = r
	}
	cases := []struct {
		name     string
		tokens   int
		priority int
	}{{"blocker (no hint)", 64, 0}, {"priority 1", 65, -1}, {"strict only", 66, 0}, {"priority 10", 67, -10}}
	for _, c := range cases {
		r, ok := byLen[c.tokens]
		if !ok {
			t.Fatalf("no record of %s", c.name)
		}
		if r.Priority != c.priority {
			t.Errorf("%s: engine received priority %d, want %d", c.name, r.Priority, c.priority)
		}
	}
	// vLLM order: lower priority value first, then arrival.
	hi, lo, st := byLen[67], byLen[65], byLen[66]
	if !hi.Start.Before(lo.Start) || !lo.Start.Before(st.Start) {
		t.Errorf("engine admitted priority 10 at %v, priority 1 at %v, strict-only at %v: want that order",
			hi.Start.Format(time.StampMicro), lo.Start.Format(time.StampMicro), st.Start.Format(time.StampMicro))
	}
}

// TestHeaderOnlyGrantAwaitsTheEngine: behind a gateway that sends no
// response phase, a grant whose stream ended stays charged until a fresh
// scrape shows the engine got it. While /metrics hangs no scrape can,
// so the grant is on /metrics and in `laneway status` as awaiting the
// engine, beside the prefill rate learned from the engine's prompt-token
// counter; the first scrape after the hang releases it.
func TestHeaderOnlyGrantAwaitsTheEngine(t *testing.T) {
	s := startSim(t, "127.0.0.111", "--time-per-output-token=2ms")
	px := startMetricsProxy(t, "127.0.0.112", s)
	p := startEPP(t, []string{px.addr}, "--policy-config="+thresholdPolicy(t, 100000), "--scrape-interval=100ms", relaxedStaleness)
	gw := bins.RunGateway(t, launch.GatewayOptions{EPP: p, Timeout: 2 * time.Minute, HeaderOnly: true}).URL
	p.Metrics.Await(t, 0, "laneway_endpoint_metrics_stale", "endpoint", px.addr)

	// The rate is learned over windows of half a second in which the
	// prompt-token counter moved.
	var rate float64
	seed := uint64(0)
	launch.WaitFor(t, func() string { return fmt.Sprintf("a learned prefill rate, after %d requests", seed) }, func() bool {
		seed++
		mustPost(t, gw, completion(tokens(500, 1000+seed), 2, nil))
		rate = p.Metrics.Value(t, "laneway_endpoint_prefill_rate_tokens_per_second", "endpoint", px.addr)
		return rate > 0
	})
	p.Metrics.Await(t, 0, "laneway_endpoint_awaiting_engine_grants", "endpoint", px.addr)

	px.setHang(true)
	// Answered by the engine; its stream ended at the pick.
	mustPost(t, gw, completion(tokens(300, 1), 2, nil))
	p.Metrics.Await(t, 1, "laneway_endpoint_awaiting_engine_grants", "endpoint", px.addr)
	var page status.Page
	bins.ReadStatus(t, p, &page)
	if len(page.Endpoints) != 1 || page.Endpoints[0].AwaitingEngine != 1 || page.Endpoints[0].PrefillRate <= 0 ||
		page.Endpoints[0].ActivePrefillTokens != 300 {
		t.Fatalf("laneway status while /metrics hangs: %+v, want 1 grant of 300 tokens awaiting the engine and a prefill rate", page.Endpoints)
	}
	table := bins.RunLaneway(t, "status", "--epp", p.StatusAddr)
	if !strings.Contains(table, "await") || !strings.Contains(table, "rate/s") {
		t.Errorf("laneway status table lacks the await and rate/s columns:\n%s", table)
	}
	t.Logf("prefill rate %.0f tokens/s after %d requests; status %+v", rate, seed, page.Endpoints[0])

	px.setHang(false)
	p.Metrics.Await(t, 0, "laneway_endpoint_awaiting_engine_grants", "endpoint", px.addr)
}

// TestStalledGatewayIsNotSentAgain: behind a header-only gateway whose
// way to the engine stalls for longer than the engine stays busy, the
// picker's grants are on their way and the engine, quiet, counts none of
// them. The picker must not take them for arrived and send a second
// wave on top: when the stall ends, only the first wave lands. (Before,
// a quiet engine released them after half a second, and two pickers on a
// saturated node had engine waiting 21 and 27 against a bound of 8.)
func TestStalledGatewayIsNotSentAgain(t *testing.T) {
	s, px, p, gw := stallRig(t, "127.0.0.121", "127.0.0.122")

	ctx, cancel := context.WithTimeout(context.Background(), launch.EventTimeout)
	defer cancel()
	// A long request (400 tokens at 2 ms) keeps the engine busy; once the
	// engine's counts show it, the picker holds nothing.
	long := postAsync(ctx, gw, completion(tokens(100, 2), 400, nil))
	s.Metrics.Await(t, 1, "vllm:num_requests_running")
	p.Metrics.Await(t, 0, "laneway_endpoint_awaiting_engine_grants", "endpoint", px.addr)

	px.setStall(true)
	var answers []<-chan answer
	for i := range 6 {
		answers = append(answers, postAsync(ctx, gw, completion(tokens(512, uint64(10+i)), 1, nil)))
	}
	// The first wave: what the threshold lets go, held on its way. The
	// long request ends at about 0.8 s and the engine goes quiet; the
	// picker gives the wave up only at maxTransit (3 s).
	wave := heldWave(t, p, px)
	noSecondWave(t, px, wave, 2500*time.Millisecond, "the picker sent again what the stalled gateway held")
	if a := await(t, long); a.err != nil || a.status != http.StatusOK {
		t.Fatalf("long request: status %d, err %v", a.status, a.err)
	}
	waiting := s.Metrics.WatchMax(20*time.Millisecond, "vllm:num_requests_waiting")
	px.setStall(false)
	for _, ch := range answers {
		if a := await(t, ch); a.err != nil || a.status != http.StatusOK {
			t.Fatalf("request after the stall: status %d, err %v: %s", a.status, a.err, a.body)
		}
	}
	// One engine sequence: the wave lands as one running and the rest
	// waiting; a second wave on top would wait too.
	most, samples, err := waiting.Stop()
	t.Logf("first wave %v held 2.5 s; engine waiting at most %v over %d samples after the stall", wave, most, samples)
	if err != nil || most > wave-1 {
		t.Fatalf("engine waiting at most %v after the stall (scrape error %v), want at most %v: only the first wave lands", most, err, wave-1)
	}
}

// TestAbortIsNotARestart: a request whose client went away leaves the
// engine without being counted finished, so the engine's arrival count
// goes back; its prompt-token counter does not. Behind a header-only
// gateway whose way to the engine stalls, the picker's grants are still
// on their way when that happens: it must keep them charged and not
// send a second wave. (Taken for a restart, one abort released them all.)
func TestAbortIsNotARestart(t *testing.T) {
	s, px, p, gw := stallRig(t, "127.0.0.131", "127.0.0.132")

	// A stranger, straight to the engine, runs for seconds.
	direct, leave := context.WithCancel(context.Background())
	defer leave()
	stranger := postAsync(direct, "http://"+s.Addr, completion(tokens(100, 2), 5000, nil))
	p.Metrics.Await(t, 1, "laneway_endpoint_engine_running_requests", "endpoint", px.addr)

	ctx, cancel := context.WithTimeout(context.Background(), launch.EventTimeout)
	defer cancel()
	px.setStall(true)
	var answers []<-chan answer
	for i := range 6 {
		answers = append(answers, postAsync(ctx, gw, completion(tokens(512, uint64(20+i)), 1, nil)))
	}
	wave := heldWave(t, p, px)
	// The stranger's client goes away: the engine drops it uncounted.
	leave()
	if a := await(t, stranger); a.err == nil {
		t.Fatalf("the stranger finished (%d) although its client went away", a.status)
	}
	s.Metrics.Await(t, 0, "vllm:num_requests_running")
	noSecondWave(t, px, wave, 1500*time.Millisecond, "the picker took the abort for a restart")
	if v := p.Metrics.Value(t, "laneway_endpoint_awaiting_engine_grants", "endpoint", px.addr); v != wave {
		t.Errorf("awaiting %v after the abort, want the wave of %v", v, wave)
	}
	px.setStall(false)
	for _, ch := range answers {
		if a := await(t, ch); a.err != nil || a.status != http.StatusOK {
			t.Fatalf("request after the stall: status %d, err %v: %s", a.status, a.err, a.body)
		}
	}
}

// TestCoincidenceIsNotAlone: a cold picker takes itself for alone when
// the engine, still for a few scrapes, has counted exactly as many
// arrivals as it sent. Behind a gateway that stalls while another
// client's requests land, that can be a coincidence: the arrivals are
// the stranger's, and the picker's own are still on their way. One such
// pass releases what the half share held, but the share stays cold
// until a second pass agrees, so the stranger's later arrivals do not
// release the picker's next grants too. (Taken at share 1 after one
// pass, two cold pickers behind TLS-storming gateways each took the
// other's arrivals for their own in about 1 cold run in 20 and landed
// engine waiting 10 against a bound of 8.)
func TestCoincidenceIsNotAlone(t *testing.T) {
	// Sixteen sequences: the stranger's requests run, none waits, so the
	// busy test holds only the picker's own grants. Nothing goes through
	// first: the picker must be cold.
	s, px, p, gw := stalledWay(t, "127.0.0.141", "127.0.0.142", "--max-num-seqs=16", "--time-per-output-token=2ms")
	if v := p.Metrics.Value(t, "laneway_endpoint_arrival_share", "endpoint", px.addr); v != 0.5 {
		t.Fatalf("arrival share %v before anything was sent, want 0.5 (cold)", v)
	}

	ctx, cancel := context.WithTimeout(context.Background(), launch.EventTimeout)
	defer cancel()
	direct, leave := context.WithCancel(context.Background())
	defer leave()
	var answers []<-chan answer
	// wave sends n requests through the gateway and waits until all n
	// are held on their way, awaiting the engine.
	wave := func(n int, seed uint64) {
		t.Helper()
		want := px.stalledRequests() + n
		for i := range n {
			answers = append(answers, postAsync(ctx, gw, completion(tokens(512, seed+uint64(i)), 1, nil)))
		}
		launch.WaitFor(t, func() string { return fmt.Sprintf("a wave of %d held on its way", n) }, func() bool {
			return px.stalledRequests() == want &&
				p.Metrics.Value(t, "laneway_endpoint_awaiting_engine_grants", "endpoint", px.addr) == float64(n)
		})
	}
	// strangers sends n long requests straight to the engine and waits
	// until the picker's scrape shows the engine running total of them.
	strangers := func(n, total int, seed uint64) {
		t.Helper()
		for i := range n {
			go post(direct, "http://"+s.Addr, completion(tokens(100, seed+uint64(i)), 5000, nil))
		}
		p.Metrics.Await(t, float64(total), "laneway_endpoint_engine_running_requests", "endpoint", px.addr)
	}

	px.setStall(true)
	wave(3, 40)
	// The engine counts 3 arrivals, as many as the picker sent, and then
	// none for the scrapes that make a pass: the held grants go.
	strangers(3, 3, 50)
	p.Metrics.Await(t, 0, "laneway_endpoint_awaiting_engine_grants", "endpoint", px.addr)
	if v := p.Metrics.Value(t, "laneway_endpoint_arrival_share", "endpoint", px.addr); v != 0.5 {
		t.Fatalf("arrival share %v after one pass for alone, want 0.5: one coincidence of the counts is not enough", v)
	}

	// Three more grants on their way, and two strangers' arrivals: at the
	// cold share they match one of them.
	wave(3, 60)
	strangers(2, 5, 70)
	if v := p.Metrics.Value(t, "laneway_endpoint_awaiting_engine_grants", "endpoint", px.addr); v != 2 {
		t.Errorf("awaiting %v after 2 strangers' arrivals against 3 grants on their way, want 2 (half of them matched)", v)
	}

	leave()
	px.setStall(false)
	for _, ch := range answers {
		if a := await(t, ch); a.err != nil || a.status != http.StatusOK {
			t.Fatalf("request after the stall: status %d, err %v: %s", a.status, a.err, a.body)
		}
	}
}
