package simulate

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/internal/testbed/workload"
	"github.com/laneway-dev/laneway/pkg/policy"
)

// weightedShareSpec is SPEC §11's workload: 320 + 320 distinct 512-token
// prompts of one output token, released together, interleaved.
const weightedShareSpec = "class=premium,arrival=once,count=320,prompt=512,output=1;class=regular,arrival=once,count=320,prompt=512,output=1"

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// runMain runs an invocation and reads back its summary.json.
func runMain(t *testing.T, c Config) *Summary {
	t.Helper()
	c.Out = t.TempDir()
	c.NoPlots = true
	if err := Main(&c, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(c.Out, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s Summary
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

func classOf(t *testing.T, p PolicySummary, name string) ClassSummary {
	t.Helper()
	for _, c := range p.Classes {
		if c.Class == name {
			return c
		}
	}
	t.Fatalf("policy %s has no class %s", p.Policy, name)
	return ClassSummary{}
}

// TestWeightedShareSummary runs SPEC §11's workload through the whole
// command (policy files, the real core, the engine model) and checks the
// JSON: in the first 320 completions premium has 256 ± 4 with quanta
// 512:128 (ideal 256:64) and 160 ± 4 with 512:512, and every request is
// answered 200.
func TestWeightedShareSummary(t *testing.T) {
	dir := t.TempDir()
	weighted := filepath.Join(dir, "weighted.yaml")
	equal := filepath.Join(dir, "equal.yaml")
	for f, q := range map[string]uint64{weighted: 128, equal: 512} {
		if err := os.WriteFile(f, []byte(workload.PolicyYAML(512, q)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c := DefaultConfig()
	c.Generate = weightedShareSpec
	c.Policies = []string{weighted, equal, BaselineNone}
	c.Engine = DemoEngine()
	s := runMain(t, c)
	if len(s.Policies) != 3 || s.Policies[0].Policy != "weighted" || s.Policies[1].Policy != "equal" || s.Policies[2].Policy != "none" {
		t.Fatalf("policies %+v", s.Policies)
	}
	for _, tt := range []struct {
		policy          int
		premium, margin int
	}{
		{0, 256, 4},
		{1, 160, 4},
		{2, 160, 4}, // FCFS on one server: the interleaving
	} {
		p := s.Policies[tt.policy]
		prem, reg := classOf(t, p, "premium"), classOf(t, p, "regular")
		if p.FirstN != 320 {
			t.Fatalf("%s: first_n %d, want 320", p.Policy, p.FirstN)
		}
		if d := prem.FirstN - tt.premium; d < -tt.margin || d > tt.margin || prem.FirstN+reg.FirstN != 320 {
			t.Errorf("%s: first 320 = premium %d : regular %d, want %d ± %d", p.Policy, prem.FirstN, reg.FirstN, tt.premium, tt.margin)
		}
		if p.Total.Completed != 640 || p.Total.Rejected429 != 0 || p.Total.Unavailable503 != 0 {
			t.Errorf("%s: %d completed, %d 429, %d 503; want all 640 answered 200", p.Policy, p.Total.Completed, p.Total.Rejected429, p.Total.Unavailable503)
		}
		// 640 prompts of 512 tokens at 40,000 tokens/s, back to back.
		if p.MakespanS < 8.19 || p.MakespanS > 8.2 {
			t.Errorf("%s: makespan %.3fs, want 8.192s", p.Policy, p.MakespanS)
		}
	}
	if q := s.Policies[2].Total.Queued; q != 0 {
		t.Errorf("none queued %d requests", q)
	}
}

// TestPredictWeightedShare is the demo's prediction column: the same
// numbers from the helper.
func TestPredictWeightedShare(t *testing.T) {
	for _, tt := range []struct {
		regular uint64
		want    int
	}{{128, 256}, {512, 160}} {
		p, err := PredictWeightedShare(512, tt.regular, 320)
		if err != nil {
			t.Fatal(err)
		}
		if d := p.FirstInPrefix - tt.want; d < -4 || d > 4 || p.Makespan < 8190*time.Millisecond || p.Makespan > 8200*time.Millisecond {
			t.Errorf("512:%d: %+v, want premium %d ± 4 and a makespan of 8.192s", tt.regular, p, tt.want)
		}
	}
}

// TestSingleClassNeverQueues: a class without a busy threshold
// (prefill_busy_threshold none; the default is auto) never holds a
// request, however overloaded the fleet.
func TestSingleClassNeverQueues(t *testing.T) {
	pol := writeFile(t, "one.yaml", "policy_classes:\n  - name: only\n    queue_policy: fcfs\n    quantum: 1\n    prefill_busy_threshold: none\n")
	c := DefaultConfig()
	c.Generate = "rate=400,prompt=200-2000,output=~50,duration=20s"
	c.Policies = []string{pol}
	c.Engine.MaxNumSeqs = 8
	c.Servers = 2
	s := runMain(t, c)
	p := s.Policies[0]
	only := classOf(t, p, "only")
	if only.Queued != 0 || only.QueueWait.P99 != 0 || only.Rejected429 != 0 || only.Completed != only.Requests || only.Requests < 7000 {
		t.Fatalf("single class without threshold: %+v", only)
	}
	if only.TTFT.P99 < 1000 {
		t.Fatalf("TTFT p99 %.0f ms: the fleet was not overloaded, the test shows nothing", only.TTFT.P99)
	}
}

// TestLimitsAre429sAndRetries: a queue limit answers 429 (counted, not
// retried by default); with --retry-429 the rejected requests come back
// and are served.
func TestLimitsAre429sAndRetries(t *testing.T) {
	pol := writeFile(t, "tight.yaml", `policy_classes:
  - name: only
    queue_policy: fcfs
    quantum: 1
    prefill_busy_threshold: 1000
    request_queue_limit_per_worker: 2
`)
	c := DefaultConfig()
	c.Generate = "arrival=once,count=50,prompt=900,output=1"
	c.Policies = []string{pol}
	c.Engine = DemoEngine()
	p := runMain(t, c).Policies[0]
	// Two go direct (the second makes the endpoint busy), two queue, the
	// other 46 find the queue at its limit of 2 × 1 endpoint.
	if p.Total.Rejected429 != 46 || p.Total.Completed != 4 {
		t.Fatalf("429s %d, completed %d; want 46 and 4", p.Total.Rejected429, p.Total.Completed)
	}
	c.Retries, c.RetryDelay = 100, 50*time.Millisecond
	p = runMain(t, c).Policies[0]
	if p.Total.Rejected429 != 0 || p.Total.Completed != 50 {
		t.Fatalf("with retries: 429s %d, completed %d; want 0 and 50", p.Total.Rejected429, p.Total.Completed)
	}
}

// TestTenantLimitsAre429s: a tenant's own queue limit is a 429 as the
// picker answers it (queue_limit, the tenant named), counted and retried
// as such, not a 503.
func TestTenantLimitsAre429s(t *testing.T) {
	pol := writeFile(t, "tenants.yaml", `tenants:
  - name: x
    match: {exact: [x]}
    request_queue_limit: 2
policy_classes:
  - name: only
    queue_policy: fcfs
    quantum: 1
    prefill_busy_threshold: 1000
    tenant_fairness: true
`)
	var trace strings.Builder
	for range 50 {
		trace.WriteString(`{"arrival_ms": 0, "class": "only", "tenant": "x", "prompt_tokens": 900}` + "\n")
	}
	c := DefaultConfig()
	c.Trace = writeFile(t, "t.jsonl", trace.String())
	c.Policies = []string{pol}
	c.Engine = DemoEngine()
	p := runMain(t, c).Policies[0]
	// Two go direct, two queue, the other 46 find tenant x at its limit.
	if p.Total.Rejected429 != 46 || p.Total.Unavailable503 != 0 || p.Total.Completed != 4 {
		t.Fatalf("429s %d, 503s %d, completed %d; want 46, 0 and 4", p.Total.Rejected429, p.Total.Unavailable503, p.Total.Completed)
	}
	c.Retries, c.RetryDelay = 100, 50*time.Millisecond
	if p = runMain(t, c).Policies[0]; p.Total.Completed != 50 {
		t.Fatalf("with retries: completed %d, want 50", p.Total.Completed)
	}
}

// TestRequestsJSONL checks requests.jsonl's fields, order and values on a
// three-request trace whose timeline is known: one server, 2000
// tokens/s, 10 ms per decode step.
func TestRequestsJSONL(t *testing.T) {
	trace := writeFile(t, "t.jsonl", `{"arrival_ms": 0, "class": "a", "tenant": "x", "prompt_tokens": 200, "output_tokens": 3}
{"arrival_ms": 50, "class": "b", "prompt_tokens": 100, "output_tokens": 1}

{"arrival_ms": 10.5, "class": "a", "tenant": "y", "prompt_tokens": 100}
`)
	c := DefaultConfig()
	c.Trace = trace
	c.Out = t.TempDir()
	c.NoPlots = true
	c.Engine.PrefillTokensPerSec = 2000
	c.Engine.TimePerOutputToken = 10 * time.Millisecond
	if err := Main(&c, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(c.Out, "none", "requests.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("%q: %v", sc.Text(), err)
		}
		lines = append(lines, m)
	}
	// Request 0 prefills alone, 0-100 ms. Requests 2 (10.5 ms) and 1
	// (50 ms) wait for that step and share the next, 100-210 ms: 200
	// prompt tokens (100 ms) and request 0's decode (10 ms). Then decode
	// steps of 10 ms: request 0's third token at 220, request 2's
	// sixteenth (the default output) at 210 + 15 × 10.
	want := []map[string]any{
		{"id": 0.0, "class": "a", "tenant": "x", "arrival_ms": 0.0, "dispatch_ms": 0.0, "first_token_ms": 100.0, "end_ms": 220.0, "status": 200.0, "server": 0.0, "cached_tokens": 0.0},
		{"id": 1.0, "class": "b", "tenant": "", "arrival_ms": 50.0, "dispatch_ms": 50.0, "first_token_ms": 210.0, "end_ms": 210.0, "status": 200.0, "server": 0.0, "cached_tokens": 0.0},
		{"id": 2.0, "class": "a", "tenant": "y", "arrival_ms": 10.5, "dispatch_ms": 10.5, "first_token_ms": 210.0, "end_ms": 360.0, "status": 200.0, "server": 0.0, "cached_tokens": 0.0},
	}
	if !reflect.DeepEqual(lines, want) {
		for i := range lines {
			t.Logf("got  %v", lines[i])
		}
		t.Fatalf("want %v", want)
	}
}

// TestDeterministic: two runs of the same inputs give identical outcomes,
// picker tie-breaks and generated trace included.
func TestDeterministic(t *testing.T) {
	c := DefaultConfig()
	c.Generate = "class=a,rate=300,prompt=100-3000,output=~40,prefix=512,groups=5,duration=5s;class=b,arrival=bursty,on=1s,off=1s,rate=100,prompt=~1500,output=~20,duration=5s"
	c.Policies = []string{writeFile(t, "p.yaml", workload.PolicyYAML(300, 100)), BaselineRoundRobin, BaselineNone}
	c.AssignTenant = "uniform:7"
	c.Servers = 4
	c.Engine.MaxNumSeqs = 16
	s, err := c.Load()
	if err != nil {
		t.Fatal(err)
	}
	a, _, err := RunAll(s, c.Options(), nil)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := c.Load()
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := RunAll(s2, c.Options(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range a {
		if !reflect.DeepEqual(a[i].Outcomes, b[i].Outcomes) {
			t.Fatalf("policy %s: two runs differ", a[i].Policy.Name)
		}
	}
}

// TestRoundRobinTakesTurns: the round-robin baseline sends requests to
// the servers in turn, whatever their load.
func TestRoundRobinTakesTurns(t *testing.T) {
	c := DefaultConfig()
	c.Generate = "arrival=uniform,rate=100,count=12,prompt=100,output=1"
	c.Policies = []string{BaselineRoundRobin}
	c.Servers = 3
	s, err := c.Load()
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(s.Trace, s.Fleet, s.Policies[0], c.Options())
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range res.Outcomes {
		if int(o.Server) != i%3 {
			t.Fatalf("request %d on server %d, want %d", i, o.Server, i%3)
		}
	}
}

// TestPrefixAwarePick: requests of one prefix group follow their cached
// prefix with the prefix picker, and the engines' hit rate shows it.
func TestPrefixAwarePick(t *testing.T) {
	c := DefaultConfig()
	c.Generate = "arrival=uniform,rate=20,count=400,prompt=4096,prefix=4000,groups=8,output=1"
	c.Policies = []string{writeFile(t, "p.yaml", "policy_classes:\n  - name: only\n    quantum: 1\n"), BaselineRoundRobin}
	c.Servers = 4
	// A server's cache holds two groups' prefixes (and one request's
	// blocks): the picker must keep each group on its server.
	c.Engine.NumGPUBlocks = 760
	s := runMain(t, c)
	prefix, rr := s.Policies[0], s.Policies[1]
	// Each group's first request misses; the others hit 3,984 of their
	// 4,096 tokens on the server that has the group. Round-robin sends
	// every group everywhere, and the caches thrash.
	if prefix.PrefixHitRate < 0.9 {
		t.Errorf("prefix picker hit rate %.2f, want above 0.9", prefix.PrefixHitRate)
	}
	if rr.PrefixHitRate > prefix.PrefixHitRate-0.1 {
		t.Errorf("round-robin hit rate %.2f not clearly below the prefix picker's %.2f", rr.PrefixHitRate, prefix.PrefixHitRate)
	}
}

// TestBaselineKeepsClasses: none keeps the first policy's classes (so the
// figures compare per class) without any threshold.
func TestBaselineKeepsClasses(t *testing.T) {
	cfg, err := policy.LoadYAML([]byte(workload.PolicyYAML(512, 128)))
	if err != nil {
		t.Fatal(err)
	}
	stripped := withoutThresholds(cfg)
	comp, err := stripped.Compile()
	if err != nil {
		t.Fatal(err)
	}
	if len(comp.Classes) != 2 || comp.Classes[0].Queueing || comp.Classes[1].Queueing {
		t.Fatalf("stripped classes %+v", comp.Classes)
	}
	if !cfg.Root.Classes[0].Queueing() {
		t.Fatal("stripping changed the original")
	}
}

// TestPolicyManifests: the CRD manifests `laneway convert` wrote for the
// premium-regular sample load to the same model as the sample itself.
func TestPolicyManifests(t *testing.T) {
	fromObjects, err := LoadPolicyFile("../../../config/samples/objects/policy-premium-regular.yaml")
	if err != nil {
		t.Fatal(err)
	}
	fromYAML, err := LoadPolicyFile("../../../config/samples/policy-premium-regular.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(fromObjects.Canonical(), fromYAML.Canonical()) {
		t.Fatalf("manifests %+v\nyaml %+v", fromObjects.Canonical(), fromYAML.Canonical())
	}
	bad := writeFile(t, "bad.yaml", "apiVersion: laneway.dev/v1alpha1\nkind: PolicyClass\nmetadata: {name: x}\nspec: {className: x, quantum: 0, poolRef: {name: p}}\n")
	if _, err := LoadPolicyFile(bad); err == nil || !strings.Contains(err.Error(), "quantum") {
		t.Fatalf("invalid manifest: %v, want the quantum rule", err)
	}
	other := writeFile(t, "other.yaml", "apiVersion: laneway.dev/v1alpha1\nkind: Widget\n")
	if _, err := LoadPolicyFile(other); err == nil || !strings.Contains(err.Error(), "Widget") {
		t.Fatalf("unknown kind: %v", err)
	}
}

func TestLoadPoliciesErrors(t *testing.T) {
	tr, _ := Generate("arrival=once,count=1,prompt=1", 1)
	dir := t.TempDir()
	a := filepath.Join(dir, "a.yaml")
	b := filepath.Join(t.TempDir(), "a.yml")
	for _, f := range []string{a, b} {
		if err := os.WriteFile(f, []byte("policy_classes:\n  - name: x\n    quantum: 1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		args   []string
		picker string
		want   string
	}{
		{[]string{a, b}, PickerPrefix, `a second policy named "a"`},
		{[]string{"none", "none"}, PickerPrefix, "a second policy"},
		{[]string{filepath.Join(dir, "missing.yaml")}, PickerPrefix, "missing.yaml"},
		{[]string{a}, "magic", "--picker"},
	} {
		if _, err := LoadPolicies(tt.args, tt.picker, tr); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("LoadPolicies(%v): %v, want %q", tt.args, err, tt.want)
		}
	}
}

// TestTenantsInOutputs: the trace's tenants reach requests.jsonl and the
// summary's Jain index; equal demand served equally is fair.
func TestTenantsInOutputs(t *testing.T) {
	c := DefaultConfig()
	c.Generate = "class=a,tenants=4,rate=200,prompt=500,output=5,duration=10s"
	c.Policies = []string{writeFile(t, "p.yaml", workload.PolicyYAML(512, 128))}
	c.Engine = DemoEngine()
	s := runMain(t, c)
	p := s.Policies[0]
	if !s.Trace.Tenants || len(p.Tenants) != 4 || p.Total.JainTenants == nil || *p.Total.JainTenants < 0.95 {
		t.Fatalf("tenants %+v, Jain %v", p.Tenants, p.Total.JainTenants)
	}
}

// TestScrapedRunEnds: with scraping on, a run still ends when its last
// request has (scrapes recur forever otherwise), and SPEC §11's shares do
// not change: the picker sends all the load, so scrapes show no stranger's.
func TestScrapedRunEnds(t *testing.T) {
	tr, err := Generate(weightedShareSpec, 1)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := policy.LoadYAML([]byte(workload.PolicyYAML(512, 128)))
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPolicy("w", cfg, PickerPrefix)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := NewFleet(1, DemoEngine())
	done := make(chan *Result, 1)
	go func() {
		res, err := Run(tr, f, p, Options{Seed: 1, ScrapeInterval: 100 * time.Millisecond})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	select {
	case res := <-done:
		if s := Summarize(tr, res); classOf(t, s, "premium").FirstN < 252 || s.Total.Completed != 640 {
			t.Fatalf("scraped run: premium %d of the first 320, %d completed", classOf(t, s, "premium").FirstN, s.Total.Completed)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a run with scraping did not end")
	}
}
