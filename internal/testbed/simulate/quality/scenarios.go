package quality

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/laneway-dev/laneway/internal/testbed/simulate"
	"github.com/laneway-dev/laneway/pkg/engine"
)

// TwoClassPolicy is the benchmark's policy: interactive and batch, FCFS,
// quanta 3:1, each queueing once an endpoint has more than one step's
// budget (max_num_batched_tokens) of prompt tokens in prefill, so every
// engine stays saturated while the rest waits in the picker.
const TwoClassPolicy = `# The scheduling-quality benchmark's policy (docs/tuning.md).
policy_classes:
  - name: interactive
    queue_policy: fcfs
    quantum: 3000
    prefill_busy_threshold_frac: 1.0
  - name: batch
    queue_policy: fcfs
    quantum: 1000
    prefill_busy_threshold_frac: 1.0
default_policy_class: batch
`

// Quantum shares of TwoClassPolicy.
const (
	interactiveQuantum = 3000
	batchQuantum       = 1000
)

// Targets of the overload scenario (issue 16 §4).
const (
	// MaxTTFTRatio: interactive TTFT p99 at most a third of none's.
	MaxTTFTRatio = 1.0 / 3
	// MaxThroughputLoss: total output tokens/s within 3% of none's.
	MaxThroughputLoss = 0.03
)

// OverloadScenario is 8 default servers, interactive (short prompts,
// about 20% of the prompt tokens) and batch (long prompts), offered at
// twice what the fleet serves (measured: SaturatedRate) for 10 simulated
// minutes.
type OverloadScenario struct {
	Servers  int
	Duration time.Duration
	// Spec is the --generate SPEC of the offered load.
	Spec string
}

// interactive and batch request shapes: 4 interactive per batch request
// makes interactive about 20% of the prompt tokens (250 vs 4,000 mean).
const (
	interactiveShape = "prompt=100-400,output=~100"
	batchShape       = "prompt=2000-6000,output=~300"
)

// saturatedRateOf is what n default servers serve of requests of one
// shape: requests per second over the makespan of a burst released at
// once.
func saturatedRateOf(n int, shape string) (float64, error) {
	spec := fmt.Sprintf("class=all,arrival=once,count=%d,%s", 500*n, shape)
	res, sum, err := runSpec(spec, n, engine.DefaultConfig(), []string{simulate.BaselineNone}, "")
	if err != nil {
		return 0, err
	}
	return float64(len(res[0].Outcomes)) / sum.Policies[0].MakespanS, nil
}

// SaturatedRate measures what a fleet of n default servers serves of the
// benchmark's mix: requests per second over the makespan of a burst of
// 10,000 released at once (no picker queueing).
func SaturatedRate(n int) (float64, error) {
	spec := fmt.Sprintf("class=interactive,arrival=once,count=%d,%s;class=batch,arrival=once,count=%d,%s",
		1000*n, interactiveShape, 250*n, batchShape)
	res, sum, err := runSpec(spec, n, engine.DefaultConfig(), []string{simulate.BaselineNone}, "")
	if err != nil {
		return 0, err
	}
	return float64(len(res[0].Outcomes)) / sum.Policies[0].MakespanS, nil
}

// NewOverload returns the scenario at twice the saturated rate.
func NewOverload() (OverloadScenario, error) {
	const servers = 8
	rate, err := SaturatedRate(servers)
	if err != nil {
		return OverloadScenario{}, err
	}
	offered := 2 * rate
	d := 10 * time.Minute
	return OverloadScenario{Servers: servers, Duration: d, Spec: fmt.Sprintf(
		"class=interactive,rate=%.2f,%s,duration=%s;class=batch,rate=%.2f,%s,duration=%[3]s",
		offered*0.8, interactiveShape, d, offered*0.2, batchShape)}, nil
}

// OverloadFigures are the overload scenario's results.
type OverloadFigures struct {
	Spec string
	// SaturatedRate and OfferedRate are requests/s.
	SaturatedRate, OfferedRate float64
	Policy, None               simulate.PolicySummary
	// InteractiveTTFTP99 of the policy and of none, ms, and their ratio.
	InteractiveTTFTP99, NoneInteractiveTTFTP99, TTFTRatio float64
	// OutputTokensPerS of the policy and none, and the relative loss.
	OutputTokensPerS, NoneOutputTokensPerS, ThroughputLoss float64
	// BatchShare is batch's share of the uncached tokens dispatched while
	// batch was backlogged (BacklogS seconds, Coverage of them with a
	// batch request queued); BatchQuantumShare its quantum share.
	BatchShare, BatchQuantumShare, BacklogS, Coverage float64
}

// Misses lists the targets the figures miss.
func (f *OverloadFigures) Misses() []string {
	var m []string
	if f.TTFTRatio > MaxTTFTRatio {
		m = append(m, fmt.Sprintf("interactive TTFT p99 %.0f ms is %.2f of none's %.0f ms, want at most 1/3", f.InteractiveTTFTP99, f.TTFTRatio, f.NoneInteractiveTTFTP99))
	}
	if f.ThroughputLoss > MaxThroughputLoss || f.ThroughputLoss < -MaxThroughputLoss {
		m = append(m, fmt.Sprintf("output %.0f tokens/s vs none's %.0f: %.1f%% apart, want within 3%%", f.OutputTokensPerS, f.NoneOutputTokensPerS, 100*f.ThroughputLoss))
	}
	if f.BatchShare < f.BatchQuantumShare {
		m = append(m, fmt.Sprintf("batch got %.1f%% of the tokens while backlogged, below its quantum share %.1f%%", 100*f.BatchShare, 100*f.BatchQuantumShare))
	}
	return m
}

// RunOverload runs the overload scenario, writing its outputs (plots
// included) to dir when dir is not empty.
func RunOverload(dir string) (*OverloadFigures, error) {
	sc, err := NewOverload()
	if err != nil {
		return nil, err
	}
	rate, _ := SaturatedRate(sc.Servers)
	pol, cleanup, err := writePolicy("laneway", TwoClassPolicy)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	results, sum, err := runSpec(sc.Spec, sc.Servers, engine.DefaultConfig(), []string{pol, simulate.BaselineNone}, dir)
	if err != nil {
		return nil, err
	}
	f := &OverloadFigures{Spec: sc.Spec, SaturatedRate: rate, OfferedRate: 2 * rate, Policy: sum.Policies[0], None: sum.Policies[1]}
	f.InteractiveTTFTP99 = class(f.Policy, "interactive").TTFT.P99
	f.NoneInteractiveTTFTP99 = class(f.None, "interactive").TTFT.P99
	f.TTFTRatio = f.InteractiveTTFTP99 / f.NoneInteractiveTTFTP99
	f.OutputTokensPerS, f.NoneOutputTokensPerS = f.Policy.Total.OutputTokensPerSec, f.None.Total.OutputTokensPerSec
	f.ThroughputLoss = 1 - f.OutputTokensPerS/f.NoneOutputTokensPerS
	f.BatchQuantumShare = float64(batchQuantum) / (interactiveQuantum + batchQuantum)
	f.BatchShare, f.BacklogS, f.Coverage = backlogShare(results[0], sum, "batch")
	return f, nil
}

// backlogShare is class's share of the uncached prompt tokens dispatched
// from the first to the last moment it had a request in the picker's
// queue, the length of that window, and the part of it with a request of
// the class queued.
func backlogShare(res *simulate.Result, sum *simulate.Summary, name string) (share, windowS, coverage float64) {
	ci := slices.Index(res.Classes, name)
	tr := res.Trace
	type span struct{ from, to int64 }
	var spans []span
	for i, o := range res.Outcomes {
		if int(o.Class) == ci && o.Queued && o.Leave >= 0 {
			spans = append(spans, span{tr.Requests[i].Arrival, o.Leave})
		}
	}
	if len(spans) == 0 {
		return 0, 0, 0
	}
	slices.SortFunc(spans, func(a, b span) int { return int(a.from - b.from) })
	from, to := spans[0].from, int64(0)
	covered, cur := int64(0), span{spans[0].from, spans[0].from}
	for _, s := range spans {
		to = max(to, s.to)
		if s.from > cur.to {
			covered += cur.to - cur.from
			cur = s
		} else {
			cur.to = max(cur.to, s.to)
		}
	}
	covered += cur.to - cur.from
	var mine, all int64
	for i, o := range res.Outcomes {
		if o.Server < 0 || o.Leave < from || o.Leave > to {
			continue
		}
		u := int64(tr.Requests[i].PromptTokens) - int64(o.Cached)
		all += u
		if int(o.Class) == ci {
			mine += u
		}
	}
	if all == 0 || to == from {
		return 0, 0, 0
	}
	return float64(mine) / float64(all), float64(to-from) / 1e9, float64(covered) / float64(to-from)
}

// ScaleFigures are the scale scenario's results.
type ScaleFigures struct {
	Requests, Servers int
	// WallS is the whole invocation (generate, simulate, summarize);
	// RunS the simulation alone.
	WallS, RunS float64
	// RequestsPerS is simulated requests per second of RunS.
	RequestsPerS      float64
	CoreNsPerDecision float64
	Decisions         int64
	SimulatedS        float64
	Total             simulate.ClassSummary
}

// MaxScaleWall is the scale target: a million requests on 64 servers in
// under a minute.
const MaxScaleWall = 60 * time.Second

// RunScale simulates 1,000,000 requests of the benchmark's mix on 64
// default servers at 90% of their saturated rate with TwoClassPolicy.
func RunScale() (*ScaleFigures, error) {
	const servers, n = 64, 1_000_000
	start := time.Now()
	rate, err := SaturatedRate(servers)
	if err != nil {
		return nil, err
	}
	offered := 0.9 * rate
	spec := fmt.Sprintf("class=interactive,rate=%.2f,%s,count=%d;class=batch,rate=%.2f,%s,count=%d",
		offered*0.8, interactiveShape, n*4/5, offered*0.2, batchShape, n/5)
	pol, cleanup, err := writePolicy("laneway", TwoClassPolicy)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	results, sum, err := runSpec(spec, servers, engine.DefaultConfig(), []string{pol}, "")
	if err != nil {
		return nil, err
	}
	p := sum.Policies[0]
	return &ScaleFigures{
		Requests: len(results[0].Outcomes), Servers: servers,
		WallS: time.Since(start).Seconds(), RunS: p.Sim.WallS, RequestsPerS: p.Sim.RequestsPerS,
		CoreNsPerDecision: p.Sim.CoreNsPerDecision, Decisions: p.Sim.Decisions, SimulatedS: p.MakespanS, Total: p.Total,
	}, nil
}

// TenantsFigures are the tenants scenario's results.
type TenantsFigures struct {
	// QuietTTFTP99 is the p99 TTFT of the 48 quiet tenants' requests, ms,
	// with and without tenant_fairness, and their ratio (target <= 1/3).
	QuietTTFTP99Fair, QuietTTFTP99Unfair, Ratio float64
}

// tenantsFairPolicy is one class with tenant fairness; the unfair one is
// the same class without it.
const tenantsPolicy = `policy_classes:
  - name: shared
    queue_policy: fcfs
    quantum: 1000
    prefill_busy_threshold_frac: 1.0
%s`

// RunTenants runs 50 tenants in one class, 2 of them flooding, with and
// without tenant_fairness, on 8 default servers for 5 simulated minutes:
// the floods send long prompts at 1.6 times what the fleet can prefill of
// them, the 48 quiet tenants short ones at a tenth of that rate.
func RunTenants(dir string) (*TenantsFigures, error) {
	fair := fmt.Sprintf(tenantsPolicy, "    tenant_fairness: true\n")
	const servers = 8
	rate, err := saturatedRateOf(servers, batchShape)
	if err != nil {
		return nil, err
	}
	spec := fmt.Sprintf("class=shared,tenant=quiet,tenants=48,rate=%.2f,%s,duration=5m;"+
		"class=shared,tenant=flood-a,rate=%.2f,%s,duration=5m;class=shared,tenant=flood-b,rate=%.2f,%[4]s,duration=5m",
		0.16*rate, interactiveShape, 0.8*rate, batchShape, 0.8*rate)
	fairFile, c1, err := writePolicy("fair", fair)
	if err != nil {
		return nil, err
	}
	defer c1()
	unfairFile, c2, err := writePolicy("unfair", fmt.Sprintf(tenantsPolicy, ""))
	if err != nil {
		return nil, err
	}
	defer c2()
	results, _, err := runSpec(spec, servers, engine.DefaultConfig(), []string{fairFile, unfairFile}, dir)
	if err != nil {
		return nil, err
	}
	quiet := func(r *simulate.Result) float64 {
		var ttft []float64
		for i, o := range r.Outcomes {
			if q := r.Trace.Requests[i]; o.Status == 200 && len(q.Tenant) > 5 && q.Tenant[:5] == "quiet" {
				ttft = append(ttft, float64(o.First-q.Arrival)/1e6)
			}
		}
		return p99(ttft)
	}
	f := &TenantsFigures{QuietTTFTP99Fair: quiet(results[0]), QuietTTFTP99Unfair: quiet(results[1])}
	f.Ratio = f.QuietTTFTP99Fair / f.QuietTTFTP99Unfair
	return f, nil
}

func p99(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return v[max(0, (len(v)*99+99)/100-1)]
}

func class(p simulate.PolicySummary, name string) simulate.ClassSummary {
	for _, c := range p.Classes {
		if c.Class == name {
			return c
		}
	}
	return simulate.ClassSummary{Class: name}
}

// writePolicy writes a policy file, name.yaml in a fresh folder, and
// returns its path and the folder's removal.
func writePolicy(name, content string) (string, func(), error) {
	dir, err := os.MkdirTemp("", "laneway-quality-")
	if err != nil {
		return "", nil, err
	}
	p := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	return p, func() { os.RemoveAll(dir) }, nil
}

// runSpec simulates a generated trace on n servers for the given
// policies, writing outputs to dir when set.
func runSpec(spec string, n int, ec engine.Config, policies []string, dir string) ([]*simulate.Result, *simulate.Summary, error) {
	c := simulate.DefaultConfig()
	c.Generate, c.Servers, c.Engine, c.Policies = spec, n, ec, policies
	s, err := c.Load()
	if err != nil {
		return nil, nil, err
	}
	results, sum, err := simulate.RunAll(s, c.Options(), nil)
	if err != nil {
		return nil, nil, err
	}
	if dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, nil, err
		}
		if err := simulate.WriteOutputs(dir, s.Trace, results, sum); err != nil {
			return nil, nil, err
		}
		if _, err := simulate.WritePlots(dir, s.Trace, results); err != nil {
			return nil, nil, err
		}
	}
	return results, sum, nil
}
