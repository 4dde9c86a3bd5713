package intel

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/internal/testbed/workload"
)

// fairPolicy is one tenant-fair class in front of one model server with 4
// sequence slots, the tenant from the gateway's x-tenant-id header; tenant
// a weighs aWeight.
func fairPolicy(t *testing.T, aWeight int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	yaml := fmt.Sprintf(`
identity: {header: x-tenant-id}
tenants:
  - {name: a, match: {exact: [a]}, weight: %d}
policy_classes:
  - name: regular
    queue_policy: fcfs
    quantum: 512
    prefill_busy_threshold: 1536
    request_queue_limit_per_worker: 4096
    tenant_fairness: true
`, aWeight)
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// runTenants sends the mix through the gateway to one simulator behind the
// picker, released together (runTogether), and returns the completions in
// the order they finished.
func runTenants(t *testing.T, ip, policyFile string, mix []workload.Group) []workload.Completion {
	t.Helper()
	sim := startSim(t, ip, "--max-num-seqs=4", "--max-num-batched-tokens=8192", "--enable-prefix-caching=false",
		"--prefill-tokens-per-sec=40000", "--time-per-output-token=10ms")
	p := bins.RunEPP(t, launch.EPPOptions{Endpoints: []string{sim.Addr}, Policy: policyFile,
		Args: []string{"--drain-timeout=5s", "--max-num-batched-tokens=8192"}})
	res := runTogether(t, p, []*launch.Sim{sim}, workload.Spec{URL: startGateway(t, p) + "/v1/completions", Model: "sim-model", Mix: mix})
	for _, c := range res.Completions {
		if c.Err != nil || c.Status != 200 {
			t.Fatalf("%s request: status %d, %v", c.Class, c.Status, c.Err)
		}
	}
	return res.Completions
}

func tenant(label, id string, n, tokens int) workload.Group {
	return workload.Group{Label: label, Count: n, PromptTokens: tokens, Headers: map[string]string{"x-tenant-id": id}}
}

// TestFloodingTenantDoesNotHoldBackOthers: tenant a floods 600 requests and
// b sends 60, released together and interleaved, 512-token prompts: b's 60
// finish within the first 130 completions (FCFS inside the class would
// finish them among the last).
func TestFloodingTenantDoesNotHoldBackOthers(t *testing.T) {
	done := runTenants(t, "127.0.0.21", fairPolicy(t, 1), []workload.Group{tenant("a", "a", 600, 512), tenant("b", "b", 60, 512)})
	b := 0
	for i, c := range done {
		if c.Class == "b" {
			if b++; b == 60 {
				t.Logf("b's 60th completion is number %d of %d", i+1, len(done))
				if i+1 > 130 {
					t.Errorf("b's 60 requests finished by completion %d, want within the first 130", i+1)
				}
				return
			}
		}
	}
	t.Fatalf("only %d of b's requests finished", b)
}

// TestTenantShareIsByTokens: a sends 2,048-token prompts, b 256-token
// ones, equal weights, both backlogged: the tokens served while both are
// backlogged split evenly (request round robin would give a 8 times b).
func TestTenantShareIsByTokens(t *testing.T) {
	done := runTenants(t, "127.0.0.22", fairPolicy(t, 1), []workload.Group{tenant("a", "a", 150, 2048), tenant("b", "b", 900, 256)})
	tokens := map[string]int{}
	n := map[string]int{}
	for _, c := range done[:300] { // a has 150 and b 900 queued: both stay backlogged
		n[c.Class]++
		tokens[c.Class] += map[string]int{"a": 2048, "b": 256}[c.Class]
	}
	r := float64(tokens["a"]) / float64(tokens["b"])
	t.Logf("first 300 completions: a %d requests (%d tokens), b %d (%d tokens), ratio %.3f", n["a"], tokens["a"], n["b"], tokens["b"], r)
	if n["a"] >= 150 || n["b"] >= 900 {
		t.Fatalf("a tenant ran out within the window: %v", n)
	}
	if r < 0.8 || r > 1.25 {
		t.Errorf("served token ratio a:b = %.3f, want within [0.8, 1.25]", r)
	}
}

// TestTenantWeights: weights 3:1 with equal prompts give a request share of
// 3:1 (within 10%) over the first 200 completions.
func TestTenantWeights(t *testing.T) {
	done := runTenants(t, "127.0.0.23", fairPolicy(t, 3), []workload.Group{tenant("a", "a", 250, 512), tenant("b", "b", 250, 512)})
	a := 0
	for _, c := range done[:200] {
		if c.Class == "a" {
			a++
		}
	}
	t.Logf("first 200 completions: a %d, b %d", a, 200-a)
	if a < 135 || a > 165 {
		t.Errorf("a served %d of the first 200, want 150 within 10%% (3:1)", a)
	}
}
