package intel

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/internal/testbed/modelsim"
	"github.com/laneway-dev/laneway/internal/testbed/simulate/quality"
	"github.com/laneway-dev/laneway/internal/testbed/workload"
)

// The engines of the P/D test: prefill pods are SPEC §11's model server
// (4 sequences, 8192 batched tokens, no prefix caching, 40,000 prefill
// tokens/s); decode pods run the same model with room for every request
// (decode is not what the share is judged on) and a 5 ms KV transfer.
var (
	pdEngine  = []string{"--max-num-batched-tokens=8192", "--enable-prefix-caching=false", "--prefill-tokens-per-sec=40000", "--time-per-output-token=10ms"}
	pdPrefill = append([]string{"--role=prefill", "--max-num-seqs=4"}, pdEngine...)
	pdDecode  = append([]string{"--role=decode", "--max-num-seqs=64", "--kv-transfer-time=5ms", "--debug-records=2048"}, pdEngine...)
)

// TestDisaggregatedWeightedShare is SPEC §11's weighted share (quanta
// 512:128) on a disaggregated pool through the real processes: the local
// gateway, the picker and four modelsim servers, two with role prefill and
// two with role decode (from the endpoints file). Every 512-token prompt
// is above the default threshold of 256, so every request is prefilled on
// a prefill pod and decoded on a decode pod — each server's own records
// prove it, matched by request id — and the share holds on the prefill
// pods, where the busy test gates: premium >= 240 of the first 320
// completions, released together at the prefill pods (runTogether).
// Every request is answered exactly once. It runs behind a gateway with
// response phases (the first byte returns the prefill pod's charge) and
// behind a header-only one (Envoy with the response phases skipped: the
// prefill pod's engine ledger returns it, issue 21).
func TestDisaggregatedWeightedShare(t *testing.T) {
	launch.CheckGoroutines(t)
	for _, headerOnly := range []bool{false, true} {
		name := "response-phases"
		if headerOnly {
			name = "header-only"
		}
		t.Run(name, func(t *testing.T) { disaggregatedShare(t, headerOnly) })
	}
}

// disaggregatedShare is one run of TestDisaggregatedWeightedShare.
func disaggregatedShare(t *testing.T, headerOnly bool) {
	var pre, dec []*launch.Sim
	for i := range 2 {
		pre = append(pre, startSim(t, fmt.Sprintf("127.0.0.%d", 111+i), pdPrefill...))
		dec = append(dec, startSim(t, fmt.Sprintf("127.0.0.%d", 121+i), pdDecode...))
	}
	dir := t.TempDir()
	var eps strings.Builder
	for _, s := range pre {
		fmt.Fprintf(&eps, "%s prefill\n", s.Addr)
	}
	for _, s := range dec {
		fmt.Fprintf(&eps, "%s decode\n", s.Addr)
	}
	epsFile, policy := filepath.Join(dir, "endpoints"), filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(epsFile, []byte(eps.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(policy, []byte(workload.PolicyYAML(512, 128)), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startEPP(t, nil, "--endpoints-file="+epsFile, "--policy-config="+policy, "--max-num-batched-tokens=8192")
	gw := bins.RunGateway(t, launch.GatewayOptions{EPP: p, Timeout: 2 * time.Minute, HeaderOnly: headerOnly}).URL

	res := runTogether(t, p, pre, workload.Spec{
		URL: gw + "/v1/completions", Model: "sim-model", Classes: []string{"premium", "regular"},
		PerClass: 320, PromptTokens: 512, RequestIDHeader: modelsim.RequestIDHeader,
	})
	s := workload.Analyze(res)
	t.Logf("disaggregated 512:128 in %v: first 320 completions premium %d regular %d; regular left at premium drain %d; "+
		"regular at premium #80 %d; regular gained %d between premium #80 and #240",
		res.Elapsed.Round(time.Millisecond), s.FirstInPrefix, s.SecondInPrefix, s.SecondLeftAtFirstDrain, s.SecondAtFirst80, s.SecondGain80To240)
	for _, m := range s.Check(true) {
		t.Error(m)
	}

	// Answered exactly once, each id once.
	ids := map[string]bool{}
	for _, c := range res.Completions {
		if c.Err != nil || c.Status != 200 {
			t.Fatalf("request %s: status %d, %v", c.ID, c.Status, c.Err)
		}
		if ids[c.ID] {
			t.Fatalf("request %s answered twice", c.ID)
		}
		ids[c.ID] = true
	}
	if len(ids) != 640 {
		t.Fatalf("%d requests answered, want 640", len(ids))
	}

	// The servers' records: each request prefilled once on a prefill pod
	// (max_tokens 1, for a remote decode) and decoded once on a decode pod
	// that names that prefill pod.
	prefilledOn := map[string]string{}
	for _, s := range pre {
		for _, r := range records(t, s) {
			switch {
			case !r.RemoteDecode || r.MaxTokens != 1 || r.PrefilledBy != "":
				t.Errorf("prefill pod %s served %+v, want only remote-decode prefills of max_tokens 1", s.Addr, r)
			case prefilledOn[r.RequestID] != "":
				t.Errorf("request %s prefilled on %s and %s", r.RequestID, prefilledOn[r.RequestID], s.Addr)
			}
			prefilledOn[r.RequestID] = s.Addr
		}
	}
	decoded := map[string]bool{}
	for _, s := range dec {
		for _, r := range records(t, s) {
			switch {
			case r.PrefilledBy == "" || r.PrefilledBy != prefilledOn[r.RequestID]:
				t.Errorf("decode pod %s: request %s prefilled by %q, the prefill pods recorded it on %q", s.Addr, r.RequestID, r.PrefilledBy, prefilledOn[r.RequestID])
			case decoded[r.RequestID]:
				t.Errorf("request %s decoded twice", r.RequestID)
			case r.CachedTokens != 511:
				t.Errorf("request %s decoded with %d prompt tokens cached, want 511 (the transferred prompt)", r.RequestID, r.CachedTokens)
			}
			decoded[r.RequestID] = true
		}
	}
	for id := range ids {
		if prefilledOn[id] == "" || !decoded[id] {
			t.Errorf("request %s: prefilled on %q, decoded %t; want both", id, prefilledOn[id], decoded[id])
		}
	}
	if n := p.Metrics.Value(t, "laneway_pd_decisions_total", "decision", "disaggregated"); n != 640 {
		t.Errorf("laneway_pd_decisions_total{decision=disaggregated} = %v, want 640", n)
	}
}

// TestLoRAAffinitySmoke is a short run of make bench-quality's LoRA
// scenario through the real processes (8 adapters over 4 modelsim
// servers of 2 adapter slots, a closed loop): with the picker's adapter
// affinity the servers load adapters at most a third as often as under
// the least-loaded picker, and serve no slower.
func TestLoRAAffinitySmoke(t *testing.T) {
	launch.CheckGoroutines(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f, err := quality.RunLoRA(ctx, bins, t.TempDir(), 600)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	quality.WriteLoRA(&b, f)
	t.Log(b.String())
	for _, m := range f.Misses() {
		t.Error(m)
	}
}
