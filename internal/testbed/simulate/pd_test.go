package simulate

import (
	"strings"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/pkg/engine"
	"github.com/laneway-dev/laneway/pkg/policy"
	"github.com/laneway-dev/laneway/pkg/sched"
)

// pdFleet is two prefill servers and two decode servers of eng, the
// decode ones with a KV transfer time of kv.
func pdFleet(t *testing.T, eng engine.Config, kv time.Duration) *Fleet {
	t.Helper()
	path := writeFile(t, "fleet.yaml", `
servers:
  - {count: 2, role: prefill}
  - {count: 2, role: decode, kv_transfer_time: `+kv.String()+`}
`)
	f, err := LoadFleet(path, eng)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestDisaggregatedRun: on a P/D fleet every request above the threshold
// is prefilled on a prefill server and decoded on a decode server, after
// the prefill and the KV transfer; shorter ones are served whole by a
// decode server; a prefill server never serves a whole request.
func TestDisaggregatedRun(t *testing.T) {
	eng := engine.DefaultConfig()
	f := pdFleet(t, eng, 5*time.Millisecond)
	tr, err := Generate("rate=40,count=400,prompt=50-1500,output=20", 3)
	if err != nil {
		t.Fatal(err)
	}
	p, err := LoadPolicies([]string{BaselineNone}, PickerPrefix, tr)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(tr, f, p[0], Options{Seed: 1, DisaggregateAboveUncachedTokens: 256})
	if err != nil {
		t.Fatal(err)
	}
	disagg := 0
	for i, o := range res.Outcomes {
		q := &tr.Requests[i]
		if o.Status != 200 {
			t.Fatalf("request %d: status %d", i, o.Status)
		}
		if f.Servers[o.Server].Role == sched.RolePrefill {
			t.Fatalf("request %d (%d tokens) served by prefill server %d", i, q.PromptTokens, o.Server)
		}
		long := q.PromptTokens > 256
		if long != (o.Prefill >= 0) {
			t.Fatalf("request %d (%d tokens): prefill server %d; want one exactly above 256 tokens", i, q.PromptTokens, o.Prefill)
		}
		if !long {
			continue
		}
		disagg++
		if f.Servers[o.Prefill].Role != sched.RolePrefill {
			t.Fatalf("request %d prefilled on server %d of role %v", i, o.Prefill, f.Servers[o.Prefill].Role)
		}
		// At least its prefill and the transfer (the decode server's first
		// step computes one token).
		if min := eng.PrefillTime(q.PromptTokens) + 5*time.Millisecond; time.Duration(o.First-q.Arrival) < min {
			t.Fatalf("request %d: first token after %v, want at least %v", i, time.Duration(o.First-q.Arrival), min)
		}
	}
	s := Summarize(tr, res)
	if s.Disaggregated != disagg || disagg < 200 {
		t.Errorf("summary says %d disaggregated, counted %d (want most of 400)", s.Disaggregated, disagg)
	}
	if s.Total.ITL.P50 <= 0 {
		t.Errorf("ITL %+v, want figures", s.Total.ITL)
	}
}

// TestDisaggregatedAutoRestarts: on a P/D fleet under an auto
// threshold, every prefill server has a threshold of its own, and a
// prefill server and a decode server restarting mid-run fail what they
// held (503), the requests decoding on the restarted decode server after
// a prefill elsewhere included, while everything else is served: no
// request is left without an answer and no grant is left charged.
func TestDisaggregatedAutoRestarts(t *testing.T) {
	eng := engine.DefaultConfig()
	f := pdFleet(t, eng, 20*time.Millisecond)
	tr, err := Generate("rate=20,count=600,prompt=50-3000,output=40", 7)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := policy.LoadYAML([]byte("policy_classes: [{name: a, quantum: 1000, prefill_busy_threshold: auto}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPolicy("auto", cfg, PickerPrefix)
	if err != nil {
		t.Fatal(err)
	}
	restarts := []Restart{{After: 3 * time.Second, Server: 0, Engine: eng}, {After: 5 * time.Second, Server: 2, Engine: eng}}
	res, err := Run(tr, f, p, Options{Seed: 1, ScrapeInterval: 100 * time.Millisecond, DisaggregateAboveUncachedTokens: 256, Restarts: restarts})
	if err != nil {
		t.Fatal(err)
	}
	failed, disagg := 0, 0
	for i, o := range res.Outcomes {
		switch o.Status {
		case 200:
			if o.Prefill >= 0 {
				disagg++
			}
		case 503:
			failed++
		default:
			t.Fatalf("request %d: status %d, want 200 or 503", i, o.Status)
		}
	}
	if failed == 0 || failed > 200 || disagg < 200 {
		t.Errorf("%d failed, %d disaggregated of 600: want a few failed by the restarts and most of the rest disaggregated", failed, disagg)
	}
	if len(res.Thresholds) != 4 || len(res.Thresholds[0]) == 0 || len(res.Thresholds[1]) == 0 {
		t.Fatalf("thresholds of %d servers, want the auto threshold of each prefill server", len(res.Thresholds))
	}
	// A run whose restarts kept a grant charged would hold the requests
	// behind it: the last arrival is answered soon after it arrives.
	last := tr.Requests[tr.byArrival[len(tr.byArrival)-1]]
	t.Logf("%d failed by the restarts, %d disaggregated", failed, disagg)
	if end := res.Outcomes[tr.byArrival[len(tr.byArrival)-1]]; end.Status == 200 && time.Duration(end.First-last.Arrival) > 5*time.Second {
		t.Errorf("last request's first token %v after its arrival", time.Duration(end.First-last.Arrival))
	}
}

// TestLoRAAffinityRun: 8 adapters over 4 servers of 2 adapter slots; the
// picker's LoRA tier loads adapters far less often than placement by load
// alone, and finishes the trace no later.
func TestLoRAAffinityRun(t *testing.T) {
	eng := engine.DefaultConfig()
	eng.MaxLoRAs, eng.LoRALoadTime = 2, 100*time.Millisecond
	f, err := NewFleet(4, eng)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := Generate("rate=20,count=2000,prompt=100-600,output=~40,adapters=8", 5)
	if err != nil {
		t.Fatal(err)
	}
	p, err := LoadPolicies([]string{BaselineNone}, PickerPrefix, tr)
	if err != nil {
		t.Fatal(err)
	}
	run := func(affinity bool) PolicySummary {
		res, err := Run(tr, f, p[0], Options{Seed: 1, ScrapeInterval: 50 * time.Millisecond, NoLoRAAffinity: !affinity})
		if err != nil {
			t.Fatal(err)
		}
		return Summarize(tr, res)
	}
	on, off := run(true), run(false)
	t.Logf("adapter loads: affinity %d, least-loaded %d; makespan %.1fs / %.1fs; TTFT p50 %.0f / %.0f ms",
		on.LoRALoads, off.LoRALoads, on.MakespanS, off.MakespanS, on.Total.TTFT.P50, off.Total.TTFT.P50)
	if on.Total.Completed != 2000 || off.Total.Completed != 2000 {
		t.Fatalf("completed %d and %d, want 2000", on.Total.Completed, off.Total.Completed)
	}
	if on.LoRALoads*3 > off.LoRALoads {
		t.Errorf("adapter loads %d with affinity, %d without: want at most a third", on.LoRALoads, off.LoRALoads)
	}
	if on.Total.OutputTokensPerSec < off.Total.OutputTokensPerSec {
		t.Errorf("throughput %.0f tok/s with affinity, %.0f without: want not lower", on.Total.OutputTokensPerSec, off.Total.OutputTokensPerSec)
	}
}

// TestLoadFleetRoles: a fleet group's role, KV transfer time and adapter
// slots reach its servers and summary.json's fleet; a bad role or
// duration is an error naming the group.
func TestLoadFleetRoles(t *testing.T) {
	base := engine.DefaultConfig()
	path := writeFile(t, "fleet.yaml", `
servers:
  - {count: 2, role: prefill, max_loras: 2, lora_load_time: 150ms}
  - {count: 1, role: both}
  - {count: 1, role: decode}
`)
	f, err := LoadFleetWith(path, Server{Engine: base, KVTransferTime: 7 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	want := []sched.Role{sched.RolePrefill, sched.RolePrefill, sched.RolePrefillDecode, sched.RoleDecode}
	for i, s := range f.Servers {
		if s.Role != want[i] || s.KVTransferTime != 7*time.Millisecond {
			t.Errorf("server %d: role %v, kv %v; want %v, 7ms", i, s.Role, s.KVTransferTime, want[i])
		}
	}
	if e := f.Servers[0].Engine; e.MaxLoRAs != 2 || e.LoRALoadTime != 150*time.Millisecond {
		t.Errorf("group 1 engine: max_loras %d, lora_load_time %v", e.MaxLoRAs, e.LoRALoadTime)
	}
	fi := fleetInfo(f)
	if len(fi.Groups) != 3 || fi.Groups[0].Role != "prefill" || fi.Groups[0].Count != 2 || fi.Groups[1].Role != "" ||
		fi.Groups[2].Role != "decode" || fi.Groups[2].KVTransferTime != "7ms" {
		t.Errorf("summary fleet %+v", fi.Groups)
	}
	for _, tc := range []struct{ file, want string }{
		{"servers: [{role: prefil}]", `group 1: role: unknown role "prefil"`},
		{"servers: [{}, {kv_transfer_time: soon}]", "group 2: kv_transfer_time"},
		{"servers: [{lora_load_time: -1s}]", "group 1: --lora-load-time"},
	} {
		if _, err := LoadFleet(writeFile(t, "bad.yaml", tc.file), base); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.file, err, tc.want)
		}
	}
}

// TestGenerateAdapters: adapters=N spreads a stream over N adapters named
// from adapter= (default lora); adapter= alone names one.
func TestGenerateAdapters(t *testing.T) {
	tr, err := Generate("rate=100,count=400,prompt=10,adapters=4;rate=10,count=5,prompt=10,adapter=solo", 1)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, q := range tr.Requests {
		seen[q.Adapter]++
	}
	if len(seen) != 5 || seen["solo"] != 5 || seen["lora-1"] < 50 || seen["lora-4"] < 50 {
		t.Errorf("adapters %v, want lora-1..lora-4 about evenly and solo 5 times", seen)
	}
	if _, err := Generate("rate=1,count=1,prompt=1,adapter=a b", 1); err == nil {
		t.Error("adapter=\"a b\" accepted")
	}
}
