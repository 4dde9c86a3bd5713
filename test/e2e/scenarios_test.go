package e2e

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/laneway-dev/laneway/api/v1alpha1"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/internal/testbed/workload"
)

// weightedValues is the SPEC §11 policy as chart values, with the given
// quanta for premium and regular.
func weightedValues(premium, regular int) string {
	return fmt.Sprintf(`
policy:
  profile:
    defaultPolicyFamily: regular
    uncachedISLBuckets:
      - {name: all, minTokens: 0}
  classes:
    - {name: premium, policyFamily: premium, cacheBucket: all, queuePolicy: fcfs, quantum: %d,
       prefillBusyThreshold: 1536, requestQueueLimitPerWorker: 1024}
    - {name: regular, policyFamily: regular, cacheBucket: all, queuePolicy: fcfs, quantum: %d,
       prefillBusyThreshold: 1536, requestQueueLimitPerWorker: 1024}
`, premium, regular)
}

// oneClassValues is a single explicit class that queues above 1536 active
// prefill tokens, with extra fields.
func oneClassValues(name, extra string) string {
	return fmt.Sprintf(`
policy:
  classes:
    - {name: %s, queuePolicy: fcfs, quantum: 512, prefillBusyThreshold: 1536%s}
`, name, extra)
}

// waitPolicyAccepted waits until every PolicyClass of the release reports
// Accepted=True for its current generation: the picker validated the set
// and handed it to its dispatcher (the condition is published after the
// policy is applied). The status is the only outside signal of that.
func waitPolicyAccepted(ctx context.Context, t *testing.T, r *release) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		var list v1alpha1.PolicyClassList
		if err := r.kube.List(ctx, &list, client.InNamespace(r.ns)); err != nil {
			return false, err
		}
		if len(list.Items) == 0 {
			last = "no PolicyClass"
			return false, nil
		}
		for _, pc := range list.Items {
			c := meta.FindStatusCondition(pc.Status.Conditions, v1alpha1.ConditionAccepted)
			if c == nil || c.Status != "True" || c.ObservedGeneration != pc.Generation {
				last = fmt.Sprintf("%s generation %d: Accepted %+v", pc.Name, pc.Generation, c)
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("policy not accepted: %v (last: %s)\npicker:\n%s", err, last, r.ops.diagnostics())
	}
}

// setQuantum changes one PolicyClass's quantum, as an operator would with
// kubectl patch.
func setQuantum(ctx context.Context, r *release, object string, quantum int64) error {
	var pc v1alpha1.PolicyClass
	if err := r.kube.Get(ctx, client.ObjectKey{Namespace: r.ns, Name: object}, &pc); err != nil {
		return fmt.Errorf("get PolicyClass %s: %w", object, err)
	}
	patch := client.MergeFrom(pc.DeepCopy())
	pc.Spec.Quantum = quantum
	if err := r.kube.Patch(ctx, &pc, patch); err != nil {
		return fmt.Errorf("patch PolicyClass %s quantum %d: %w", object, quantum, err)
	}
	return nil
}

// checkAnswered fails on any transport error (a request that got no
// answer or a broken stream) and returns the answers by status.
func checkAnswered(t *testing.T, as []phasedAnswer) map[int][]phasedAnswer {
	t.Helper()
	by := map[int][]phasedAnswer{}
	for _, a := range as {
		if a.err != nil {
			t.Errorf("request %d (phase %d) lost: %v", a.index, a.phase, a.answer)
			continue
		}
		by[a.status] = append(by[a.status], a)
	}
	return by
}

// TestE2ERouting: requests go only to Ready pods, and every Ready pod
// gets some; a request pinned to a pod that is not Ready is refused with
// 503 at once instead of waiting.
func TestE2ERouting(t *testing.T) {
	c := newCluster(t)
	r := c.install(t, installSpec{name: "routing", pods: []podSpec{{name: "sim-a"}, {name: "sim-b"}, {name: "sim-c", notReady: true}}})
	ctx := testContext(t, 2*time.Minute)

	var qs []request
	for i := 0; i < 60; i++ {
		qs = append(qs, request{strict: -1, maxTokens: 4})
	}
	served := map[string]int{}
	for _, a := range r.sendAll(ctx, qs) {
		if a.err != nil || a.status != http.StatusOK {
			t.Errorf("unpinned request: %v", a)
			continue
		}
		served[a.served]++
	}
	if served["sim-a"] == 0 || served["sim-b"] == 0 || served["sim-c"] != 0 || len(served) != 2 {
		t.Errorf("served by %v; want both Ready pods (sim-a, sim-b) and never sim-c", served)
	}
	a := r.send(ctx, request{strict: -1, pin: r.pods["sim-c"].addr})
	if a.err != nil || a.status != http.StatusServiceUnavailable || a.reason != "no_endpoints" {
		t.Errorf("request pinned to the pod that is not Ready: %v; want 503 no_endpoints", a)
	}
	a = r.send(ctx, request{strict: -1, pin: r.pods["sim-b"].addr})
	if a.err != nil || a.status != http.StatusOK || a.served != "sim-b" {
		t.Errorf("request pinned to sim-b: %v; want 200 from sim-b", a)
	}
	t.Logf("60 unpinned requests served by %v", served)
}

// TestE2EWeightedShare runs the SPEC §11 workload against a pool whose
// policy is two PolicyClass objects: quanta 512:128 must give the 4:1
// bands, and after the regular class is patched to 512 (with the picker
// confirming in its status) the equal-share bands.
func TestE2EWeightedShare(t *testing.T) {
	c := newCluster(t)
	r := c.install(t, installSpec{name: "weighted", values: weightedValues(512, 128), pods: []podSpec{{name: "sim"}}})
	ctx := testContext(t, 8*time.Minute)
	waitPolicyAccepted(ctx, t, r)

	run := func(name string, weighted bool, seed int) {
		start := time.Now()
		res, err := workload.Run(ctx, workload.Spec{
			URL: r.url + "/v1/completions", Model: "sim-model", Classes: []string{"premium", "regular"},
			PerClass: 320, PromptTokens: 512, Client: r.http, Seed: 100 + seed,
		})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		s := workload.Analyze(res)
		t.Logf("quanta %s through PolicyClass objects (%.1fs): %s", name, time.Since(start).Seconds(), s)
		for _, m := range s.Check(weighted) {
			t.Errorf("quanta %s: %s", name, m)
		}
		for _, c := range res.Completions {
			if c.Err != nil {
				t.Errorf("quanta %s: first failure %s: %v", name, c.Class, c.Err)
				break
			}
		}
	}
	run("512:128", true, 0)

	if err := setQuantum(ctx, r, "pool-regular", 512); err != nil {
		t.Fatal(err)
	}
	waitPolicyAccepted(ctx, t, r)
	run("512:512", false, 1)
	checkPickerMetricsDocumented(ctx, t, r)
}

// checkPickerMetricsDocumented scrapes the picker after a workload: every
// Laneway and reference-router series it exports has a dashboard panel and
// a line in docs/metrics.md, and every series the dashboard queries is one
// the picker exports (or one of the core registry that needs a rejection
// to show a sample).
func checkPickerMetricsDocumented(ctx context.Context, t *testing.T, r *release) {
	t.Helper()
	page, err := r.ops.pickerMetrics(ctx)
	if err != nil {
		t.Fatalf("picker metrics: %v", err)
	}
	m, err := launch.ParseMetrics(bytes.NewReader(page))
	if err != nil {
		t.Fatalf("picker: %v", err)
	}
	docs, err := os.ReadFile(filepath.Join(shared.root, "docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	used, _ := dashboardMetrics(t)
	exported := map[string]bool{}
	for _, name := range m.Names() {
		if !strings.HasPrefix(name, "laneway_") && !strings.HasPrefix(name, "dynamo_frontend_router_") {
			continue
		}
		exported[name] = true
		if !used[name] {
			t.Errorf("the picker exports %s, which no dashboard panel shows", name)
		}
		if !strings.Contains(string(docs), "`"+name+"`") {
			t.Errorf("the picker exports %s, which docs/metrics.md does not describe", name)
		}
	}
	core := registeredMetrics(t)
	for name := range used {
		if !exported[name] && !core[name] {
			t.Errorf("the dashboard queries %s, which the picker does not export", name)
		}
	}
	t.Logf("%d picker series after the workload, all on the dashboard and in docs/metrics.md", len(exported))
}

// TestE2EStrictPriority: a higher strict-priority tier overtakes a backlog
// of its class. 80 low-tier requests flood one server; once 8 have
// finished, 8 high-tier ones arrive and must finish while most of the low
// backlog is still waiting, not after it.
func TestE2EStrictPriority(t *testing.T) {
	c := newCluster(t)
	r := c.install(t, installSpec{name: "strict", values: oneClassValues("standard", ""), pods: []podSpec{{name: "sim"}}})
	ctx := testContext(t, 3*time.Minute)
	waitPolicyAccepted(ctx, t, r)

	const lows, highs, sendAfter = 80, 8, 8
	type done struct {
		high bool
		a    answer
	}
	results := make(chan done, lows+highs)
	var wg sync.WaitGroup
	send := func(q request, high bool) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results <- done{high, r.send(ctx, q)}
		}()
	}
	for i := 0; i < lows; i++ {
		send(request{class: "standard", strict: 0, maxTokens: 16}, false)
	}
	var order []done
	lowDoneAtSend := -1
	for len(order) < lows+highs {
		d := <-results
		order = append(order, d)
		if lowDoneAtSend < 0 && len(order) == sendAfter {
			lowDoneAtSend = len(order)
			for i := 0; i < highs; i++ {
				send(request{class: "standard", strict: 1, maxTokens: 16}, true)
			}
		}
	}
	wg.Wait()

	lastHigh, highSeen := -1, 0
	for i, d := range order {
		if d.a.err != nil || d.a.status != http.StatusOK {
			t.Errorf("request (high=%v): %v", d.high, d.a)
		}
		if d.high {
			highSeen++
			lastHigh = i
		}
	}
	lowsBeforeLastHigh := lastHigh + 1 - highs
	overtaken := lows - lowsBeforeLastHigh
	// At the high tier's arrival the server holds at most 4 running and 4
	// waiting low requests (threshold 1536 = four 512-token prompts): those
	// may finish first, plus slack for requests already being answered.
	// Without strict priority the high tier would finish after all 80.
	if highSeen != highs || lowsBeforeLastHigh-lowDoneAtSend > 16 || overtaken < 40 {
		t.Errorf("strict priority: %d of %d high-tier answers; %d low requests finished before the last high one (%d had when the high tier arrived); %d low requests overtaken, want >= 40",
			highSeen, highs, lowsBeforeLastHigh, lowDoneAtSend, overtaken)
	}
	t.Logf("high tier arrived after %d low completions; its last answer came after %d low completions; it overtook %d queued low requests",
		lowDoneAtSend, lowsBeforeLastHigh, overtaken)
}

// TestE2EQueueLimit: a class whose queue is full answers 429 at once, with
// the JSON details naming the class, the limit kind and the numbers
// (limit 5 per worker × 1 pod).
func TestE2EQueueLimit(t *testing.T) {
	c := newCluster(t)
	r := c.install(t, installSpec{name: "limit", values: oneClassValues("limited", ", requestQueueLimitPerWorker: 5"), pods: []podSpec{{name: "sim"}}})
	ctx := testContext(t, 3*time.Minute)
	waitPolicyAccepted(ctx, t, r)

	var qs []request
	for i := 0; i < 40; i++ {
		qs = append(qs, request{class: "limited", strict: -1, maxTokens: 32})
	}
	var ok, limited int
	for _, a := range r.sendAll(ctx, qs) {
		switch {
		case a.err != nil:
			t.Errorf("lost: %v", a)
		case a.status == http.StatusOK:
			ok++
		case a.status == http.StatusTooManyRequests:
			limited++
			d, err := parseLimit(a.body)
			if err != nil || a.reason != "queue_limit" || d.Details.PolicyClass != "limited" || d.Details.LimitKind != "requests" ||
				d.Details.Current != 5 || d.Details.Limit != 5 || d.Error == "" {
				t.Errorf("429 answer %v (%v): want reason queue_limit, details {limited, requests, 5, 5}", a, err)
			}
		default:
			t.Errorf("unexpected answer %v", a)
		}
	}
	// The five queued requests and those admitted directly are served.
	if limited == 0 || ok < 5 || ok+limited != 40 {
		t.Errorf("%d answered 200 and %d 429; want some 429s and at least the 5 queued requests served", ok, limited)
	}
	if a := r.send(ctx, request{class: "limited", strict: -1}); a.err != nil || a.status != http.StatusOK {
		t.Errorf("after the flood: %v; want 200", a)
	}
	t.Logf("40 simultaneous requests: %d served, %d refused with 429 queue_limit", ok, limited)
}

// TestE2EPodDeletion deletes a pod under load: unpinned requests all get
// 200 (the terminating pod takes no new ones, the other serves them), and
// requests pinned to the deleted pod get 200 while it still runs, then a
// clean 503. No request goes unanswered.
func TestE2EPodDeletion(t *testing.T) {
	c := newCluster(t)
	r := c.install(t, installSpec{name: "delete", values: oneClassValues("standard", ", requestQueueLimitPerWorker: 1024"),
		pods: []podSpec{{name: "sim-a"}, {name: "sim-b"}}})
	ctx := testContext(t, 3*time.Minute)
	waitPolicyAccepted(ctx, t, r)
	pinA := r.pods["sim-a"].addr

	l := startLoad(ctx, r, 15*time.Millisecond, 2000, time.Minute, func(i int) request {
		q := request{class: "standard", strict: -1, maxTokens: 4}
		if i%4 == 0 {
			q.pin = pinA
		}
		return q
	})
	step := func(n int) {
		if err := l.waitCompleted(ctx, l.completed()+n); err != nil {
			l.stop()
			t.Fatalf("load stalled: %v", err)
		}
	}
	step(60)
	l.phase.Store(1) // sim-a terminating
	if err := r.ops.beginPodDeletion(ctx, "sim-a"); err != nil {
		l.stop()
		t.Fatal(err)
	}
	step(60)
	if err := r.ops.finishPodDeletion(ctx, "sim-a"); err != nil {
		l.stop()
		t.Fatal(err)
	}
	l.phase.Store(2) // sim-a gone
	step(60)
	as := l.stop()

	by := checkAnswered(t, as)
	pinnedOK, pinned503, unpinned := 0, 0, 0
	for _, a := range as {
		if a.err != nil {
			continue
		}
		switch {
		case a.req.pin == "":
			unpinned++
			if a.status != http.StatusOK {
				t.Errorf("unpinned request %d (phase %d): %v; want 200", a.index, a.phase, a.answer)
			} else if a.phase == 2 && a.served != "sim-b" {
				t.Errorf("unpinned request %d sent after sim-a was gone was served by %q", a.index, a.served)
			}
		case a.status == http.StatusOK:
			pinnedOK++
			if a.served != "sim-a" {
				t.Errorf("request %d pinned to sim-a was served by %q", a.index, a.served)
			}
		case a.status == http.StatusServiceUnavailable:
			pinned503++
			if a.phase == 0 {
				t.Errorf("request %d pinned to sim-a got 503 before the deletion: %v", a.index, a.answer)
			}
		default:
			t.Errorf("pinned request %d (phase %d): %v; want 200 or 503", a.index, a.phase, a.answer)
		}
	}
	if pinnedOK == 0 || pinned503 == 0 {
		t.Errorf("pinned requests: %d served, %d refused; want both", pinnedOK, pinned503)
	}
	t.Logf("%d requests across the deletion: %d unpinned all 200; pinned to sim-a: %d served, %d clean 503 (statuses %v)",
		len(as), unpinned, pinnedOK, pinned503, statusCounts(by))
}

// TestE2EPolicyChangeUnderLoad patches a PolicyClass while the SPEC §11
// workload runs: every request is still answered 200, and the share moves
// from even (512:512) to about 4:1 (512:128) after the change.
func TestE2EPolicyChangeUnderLoad(t *testing.T) {
	c := newCluster(t)
	r := c.install(t, installSpec{name: "change", values: weightedValues(512, 512), pods: []podSpec{{name: "sim"}}})
	ctx := testContext(t, 5*time.Minute)
	waitPolicyAccepted(ctx, t, r)

	const changeAt = 120
	changed := make(chan error, 1)
	var once sync.Once
	res, err := workload.Run(ctx, workload.Spec{
		URL: r.url + "/v1/completions", Model: "sim-model", Classes: []string{"premium", "regular"},
		PerClass: 320, PromptTokens: 512, Client: r.http, Seed: 200,
		Progress: func(done, total int) {
			if done < changeAt {
				return
			}
			// The patch runs beside the load, which keeps going.
			once.Do(func() {
				go func() { changed <- setQuantum(ctx, r, "pool-regular", 128) }()
			})
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-changed:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("the PolicyClass patch did not return")
	}
	waitPolicyAccepted(ctx, t, r)

	s := workload.Analyze(res)
	if s.Failed > 0 {
		t.Errorf("%d of %d requests not answered 200 across the policy change", s.Failed, s.OK+s.Failed)
	}
	share := func(from, to int) (float64, int) {
		p, n := 0, 0
		for i := from; i < to && i < len(res.Completions); i++ {
			n++
			if res.Completions[i].Class == "premium" {
				p++
			}
		}
		return float64(p) / float64(max(n, 1)), n
	}
	// Before: even. After (from 60 completions past the change, leaving
	// the queue time to turn over): premium about 0.8.
	before, nb := share(20, changeAt)
	after, na := share(changeAt+60, changeAt+60+150)
	if before < 0.35 || before > 0.65 || after < 0.7 || na < 150 {
		t.Errorf("premium share %.2f over %d completions before the change (want 0.35..0.65), %.2f over %d after (want >= 0.70)", before, nb, after, na)
	}
	t.Logf("premium share %.2f before the 512:512 -> 512:128 change, %.2f after; %s", before, after, s)
}

// TestE2EPickerRestart restarts the picker under load: every request gets
// an answer — 200, or a 5xx while no picker serves (the gateway turns a
// failed ext_proc stream into an error answer, never a hang) — and
// requests sent after the restart are served again.
func TestE2EPickerRestart(t *testing.T) {
	c := newCluster(t)
	r := c.install(t, installSpec{name: "restart", values: weightedValues(512, 128), pods: []podSpec{{name: "sim"}}})
	ctx := testContext(t, 5*time.Minute)
	waitPolicyAccepted(ctx, t, r)

	classes := []string{"premium", "regular"}
	l := startLoad(ctx, r, 10*time.Millisecond, 3000, 2*time.Minute, func(i int) request {
		return request{class: classes[i%2], strict: -1, maxTokens: 2}
	})
	if err := l.waitCompleted(ctx, 100); err != nil {
		l.stop()
		t.Fatal(err)
	}
	l.phase.Store(1) // restarting
	start := time.Now()
	if err := r.ops.restartPicker(ctx); err != nil {
		l.stop()
		t.Fatalf("restart: %v", err)
	}
	took := time.Since(start)
	// The gateway's connection to the picker may still be backing off
	// after the outage (gRPC reconnect backoff); requests until it has
	// reconnected may get 5xx too. One served probe marks the end.
	var probe answer
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		probe = r.send(ctx, request{class: "premium", strict: -1})
		return probe.err == nil && probe.status == http.StatusOK, nil
	}); err != nil {
		l.stop()
		t.Fatalf("no request served after the restart (last %v): %v", probe, err)
	}
	reconnected := time.Since(start)
	l.phase.Store(2) // a picker serves again, and the gateway reaches it
	if err := l.waitCompleted(ctx, l.completed()+150); err != nil {
		l.stop()
		t.Fatal(err)
	}
	as := l.stop()

	by := checkAnswered(t, as)
	after := 0
	for _, a := range as {
		if a.err != nil {
			continue
		}
		switch {
		case a.status == http.StatusOK:
		case a.at.Before(start):
			t.Errorf("request %d answered before the restart began: %v; want 200", a.index, a.answer)
		case a.phase == 2 && a.status != http.StatusOK:
			t.Errorf("request %d sent after the restart completed and a request was served: %v; want 200", a.index, a.answer)
		case a.status < 500:
			t.Errorf("request %d during the restart: %v; want 200 or 5xx", a.index, a.answer)
		}
		if a.phase == 2 && a.status == http.StatusOK {
			after++
		}
	}
	if after < 100 {
		t.Errorf("only %d requests sent after the restart were served", after)
	}
	reasons := map[string]int{}
	for _, a := range as {
		if a.err == nil && a.status != http.StatusOK {
			reasons[fmt.Sprintf("%d %s", a.status, a.reason)]++
		}
	}
	t.Logf("%d requests across a picker restart (picker ready again after %.1fs, gateway serving after %.1fs): statuses %v; non-200 by reason %v",
		len(as), took.Seconds(), reconnected.Seconds(), statusCounts(by), reasons)
}

func statusCounts(by map[int][]phasedAnswer) string {
	var parts []string
	for _, code := range sortedInts(by) {
		parts = append(parts, fmt.Sprintf("%d×%d", code, len(by[code])))
	}
	return strings.Join(parts, " ")
}

func sortedInts[V any](m map[int]V) []int {
	keys := slices.Collect(maps.Keys(m))
	slices.Sort(keys)
	return keys
}
