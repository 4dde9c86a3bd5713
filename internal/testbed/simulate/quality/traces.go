package quality

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/laneway-dev/laneway/internal/testbed/launch"
	realrun "github.com/laneway-dev/laneway/internal/testbed/replay"
	"github.com/laneway-dev/laneway/internal/testbed/simulate"
	"github.com/laneway-dev/laneway/pkg/engine"
	"github.com/laneway-dev/laneway/pkg/policy"
)

// The real-trace scenarios replay public traces: the Azure LLM inference
// traces of 2023 (code and conversation, one hour each) and the Mooncake
// conversation trace (one hour, prompts of 12,000 tokens on average that
// reuse each other's prefixes). The tests do not need them: the scenarios
// run when the folder is there (TracesDir).

// TracesEnv names the folder holding the public traces; unset, it is
// ../shared/traces next to the repository.
const TracesEnv = "LANEWAY_TRACES"

// The traces' file names in that folder.
const (
	AzureConvFile = "azure_conv_2023.csv"
	AzureCodeFile = "azure_code_2023.csv"
	MooncakeFile  = "mooncake_conversation.jsonl"
)

// TracesDir returns the traces folder: $LANEWAY_TRACES, else
// ../shared/traces next to the repository, or next to the main working
// tree when the repository is a git worktree of it. It reports an error
// when no such folder holds the traces.
func TracesDir() (string, error) {
	var dirs []string
	if dir := os.Getenv(TracesEnv); dir != "" {
		dirs = []string{dir}
	} else {
		root, err := launch.ModuleRoot()
		if err != nil {
			return "", err
		}
		dirs = append(dirs, filepath.Join(root, "..", "shared", "traces"))
		// A worktree's .git is a file naming <main>/.git/worktrees/<name>.
		if b, err := os.ReadFile(filepath.Join(root, ".git")); err == nil {
			if gitdir, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "gitdir: "); ok {
				main := filepath.Dir(filepath.Dir(filepath.Dir(gitdir)))
				dirs = append(dirs, filepath.Join(main, "..", "shared", "traces"))
			}
		}
	}
	var missing error
	for _, dir := range dirs {
		missing = nil
		for _, f := range []string{AzureConvFile, AzureCodeFile, MooncakeFile} {
			if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
				missing = fmt.Errorf("the public traces are not in %s (set %s): %w", strings.Join(dirs, " or "), TracesEnv, err)
				break
			}
		}
		if missing == nil {
			return filepath.Clean(dir), nil
		}
	}
	return "", missing
}

// TargetLoad is the share of its saturated throughput a real-trace
// scenario's fleet is offered: the smallest fleet whose saturated rate
// (requests per second of a burst of the trace's first requests, released
// at once) the trace's mean rate stays under this share of.
const TargetLoad = 0.85

// burstSample is how many of the trace's first requests the saturated
// rate is measured on.
const burstSample = 3000

// AzurePolicy is the Azure scenario's policy: conversation is interactive
// and gets three tokens of credit for each of code's, both queueing in the
// picker once an endpoint holds a full step of prefill.
const AzurePolicy = `# Azure code + conversation (docs/tuning.md).
policy_classes:
  - name: interactive
    queue_policy: fcfs
    quantum: 3000
    prefill_busy_threshold_frac: 1.0
  - name: code
    queue_policy: fcfs
    quantum: 1000
    prefill_busy_threshold_frac: 1.0
default_policy_class: code
`

// MooncakePolicy is the Mooncake scenario's policy: one class, no busy
// threshold. With a single class queueing in the picker buys no order,
// and it costs cache hits (MooncakeQueuedPolicy shows how many).
const MooncakePolicy = `# Mooncake conversation (docs/tuning.md).
policy_classes:
  - name: conversation
    queue_policy: fcfs
    quantum: 1000
default_policy_class: conversation
`

// MooncakeQueuedPolicy is MooncakePolicy queueing in the picker once an
// endpoint holds a full step of prefill.
const MooncakeQueuedPolicy = `policy_classes:
  - name: conversation
    queue_policy: fcfs
    quantum: 1000
    prefill_busy_threshold_frac: 1.0
default_policy_class: conversation
`

// TraceScenario is one real-trace scenario.
type TraceScenario struct {
	Name string
	// Dir is the traces folder.
	Dir string
	// Trace is the --trace argument.
	Trace string
	// Jitter is --jitter: the Mooncake trace's timestamps come in
	// 3-second buckets.
	Jitter time.Duration
	// Engine is every server's engine; the fleet's size is chosen for
	// TargetLoad.
	Engine engine.Config
	// Policy is the policy file's content; Extra are further policy files
	// run with the prefix picker (name → content).
	Policy string
	Extra  map[string]string
}

// AzureScenario is the Azure code and conversation traces as two classes
// (conversation interactive) on servers of half the default prefill speed,
// so that the hour needs a fleet of more than one (the pickers then
// differ).
func AzureScenario(dir string) TraceScenario {
	e := engine.DefaultConfig()
	e.PrefillTokensPerSec = 10000
	return TraceScenario{Name: "azure", Dir: dir, Engine: e, Policy: AzurePolicy,
		Trace: "interactive=" + filepath.Join(dir, AzureConvFile) + ",code=" + filepath.Join(dir, AzureCodeFile)}
}

// MooncakeScenario is the Mooncake conversation trace with prefix caching
// on servers with a KV cache of 2M tokens (131,072 blocks of 16): its
// conversations come back after two minutes at the median, so a cache
// that turns over faster than that keeps almost nothing but the shared
// first block, whatever the picker does. The trace's timestamps come in
// 3-second buckets, a dozen requests at one millisecond; a jitter of 3 s
// spreads each bucket's requests over it.
func MooncakeScenario(dir string) TraceScenario {
	e := engine.DefaultConfig()
	e.NumGPUBlocks = 131072
	return TraceScenario{Name: "mooncake", Dir: dir, Engine: e, Jitter: 3 * time.Second, Policy: MooncakePolicy,
		Trace: filepath.Join(dir, MooncakeFile), Extra: map[string]string{"prefix-queued": MooncakeQueuedPolicy}}
}

// short is a trace source without the traces folder, for reports.
func (sc TraceScenario) short(source string) string {
	if sc.Dir == "" {
		return source
	}
	return strings.ReplaceAll(source, sc.Dir+string(filepath.Separator), "")
}

// TraceRow is one run of a real-trace scenario.
type TraceRow struct {
	Policy, Picker string
	// HitRate is the engines' prefix-cache hit rate (cached prompt tokens
	// over prompt tokens).
	HitRate float64
	// Classes are TTFT percentiles per class, then the total.
	Classes []ClassRow
}

// TraceFigures are a real-trace scenario's results.
type TraceFigures struct {
	Name, Source string
	Requests     int
	SpanS        float64
	// Servers is the fleet chosen; OfferedRate the trace's mean rate and
	// SaturatedRate the fleet's (requests/s).
	Servers                    int
	OfferedRate, SaturatedRate float64
	// Rows are prefix (the policy file, the prefix picker), least-loaded
	// (the file, the least-loaded picker), none, round-robin, then the
	// extra policies.
	Rows []TraceRow
	// SimS is the wall time of the runs.
	SimS float64
}

// Row returns the row of a policy.
func (f *TraceFigures) Row(name string) TraceRow {
	for _, r := range f.Rows {
		if r.Policy == name {
			return r
		}
	}
	return TraceRow{Policy: name}
}

// config is the scenario's simulate configuration on n servers.
func (sc TraceScenario) config(n int) simulate.Config {
	c := simulate.DefaultConfig()
	c.Trace, c.Servers, c.Engine, c.Jitter = sc.Trace, n, sc.Engine, sc.Jitter
	// As the picker does: it scrapes every endpoint every 100 ms.
	c.ScrapeInterval = 100 * time.Millisecond
	return c
}

// SizeFleet returns the smallest fleet (up to 64 servers) the trace's mean
// rate loads to at most TargetLoad of its saturated rate, with that rate
// and the mean rate.
func (sc TraceScenario) SizeFleet() (servers int, saturated, offered float64, err error) {
	c := sc.config(1)
	c.NoPlots = true
	full, err := c.Load()
	if err != nil {
		return 0, 0, 0, err
	}
	offered = float64(len(full.Trace.Requests)) / full.Trace.Span().Seconds()
	for n := 1; n <= 64; n++ {
		c := sc.config(n)
		c.ScrapeInterval, c.Jitter = 0, 0
		c.TimeScale, c.Limit = 1e-12, burstSample // every request at once
		s, err := c.Load()
		if err != nil {
			return 0, 0, 0, err
		}
		res, err := simulate.Run(s.Trace, s.Fleet, s.Policies[0], c.Options())
		if err != nil {
			return 0, 0, 0, err
		}
		saturated = float64(len(s.Trace.Requests)) / simulate.Summarize(s.Trace, res).MakespanS
		if offered <= TargetLoad*saturated {
			return n, saturated, offered, nil
		}
	}
	return 0, 0, 0, fmt.Errorf("%s: 64 servers saturate at %.2f requests/s, below the trace's %.2f / %.2f", sc.Name, saturated, offered, TargetLoad)
}

// policies returns the scenario's runs: prefix, least-loaded, none,
// round-robin and the extras, named so.
func (sc TraceScenario) policies(t *simulate.Trace) ([]*simulate.Policy, error) {
	cfg, err := policy.LoadYAML([]byte(sc.Policy))
	if err != nil {
		return nil, err
	}
	prefix, err := simulate.NewPolicy("prefix", cfg, simulate.PickerPrefix)
	if err != nil {
		return nil, err
	}
	ll, err := simulate.NewPolicy("least-loaded", cfg, simulate.PickerLeastLoaded)
	if err != nil {
		return nil, err
	}
	file, cleanup, err := writePolicy("prefix", sc.Policy)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	base, err := simulate.LoadPolicies([]string{file, simulate.BaselineNone, simulate.BaselineRoundRobin}, simulate.PickerPrefix, t)
	if err != nil {
		return nil, err
	}
	out := []*simulate.Policy{prefix, ll, base[1], base[2]}
	for _, name := range slices.Sorted(maps.Keys(sc.Extra)) {
		c, err := policy.LoadYAML([]byte(sc.Extra[name]))
		if err != nil {
			return nil, err
		}
		p, err := simulate.NewPolicy(name, c, simulate.PickerPrefix)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// RunTrace sizes the scenario's fleet and simulates every run of it,
// writing the outputs and figures to dir.
func RunTrace(sc TraceScenario, dir string) (*TraceFigures, error) {
	n, saturated, offered, err := sc.SizeFleet()
	if err != nil {
		return nil, err
	}
	c := sc.config(n)
	s, err := c.Load()
	if err != nil {
		return nil, err
	}
	if s.Policies, err = sc.policies(s.Trace); err != nil {
		return nil, err
	}
	start := time.Now()
	results, sum, err := simulate.RunAll(s, c.Options(), nil)
	if err != nil {
		return nil, err
	}
	f := &TraceFigures{Name: sc.Name, Source: sc.short(s.Trace.Source), Requests: len(s.Trace.Requests), SpanS: s.Trace.Span().Seconds(),
		Servers: n, OfferedRate: offered, SaturatedRate: saturated, SimS: time.Since(start).Seconds()}
	for _, p := range sum.Policies {
		f.Rows = append(f.Rows, TraceRow{Policy: p.Policy, Picker: p.Picker, HitRate: p.PrefixHitRate,
			Classes: rows(append(append([]simulate.ClassSummary(nil), p.Classes...), p.Total))})
	}
	if dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		if err := simulate.WriteOutputs(dir, s.Trace, results, sum); err != nil {
			return nil, err
		}
		if _, err := simulate.WritePlots(dir, s.Trace, results); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// BothWaysDuration is how much of the Mooncake trace the two-way run
// replays: its first minutes, at the recorded rate, on the scenario's
// fleet.
const BothWaysDuration = 3 * time.Minute

// TraceTwoWayFigures compare one real-trace run through real processes
// with its simulation.
type TraceTwoWayFigures struct {
	Source   string
	Requests int
	Servers  int
	// Classes: TTFT p50 and p99 real and simulated, per class.
	Classes []ClassComparison
	// HitReal and HitSim are the engines' prefix-cache hit rates.
	HitReal, HitSim             float64
	RealMakespanS, SimMakespanS float64
	// RealFailed counts requests that did not complete in the real run.
	RealFailed int
}

// Agreement lists where the two ways disagree beyond the bands:
// TTFT p50 per class within 20%, the hit rate within 5 points (as the
// overload scenario's shares are judged; the report gives the relative
// difference too).
func (f *TraceTwoWayFigures) Agreement() []string {
	var m []string
	for _, c := range f.Classes {
		if d := c.RealP50/c.SimP50 - 1; !(math.Abs(d) <= 0.2) {
			m = append(m, fmt.Sprintf("%s TTFT p50: real %.0f ms, simulated %.0f ms (%+.0f%%)", c.Class, c.RealP50, c.SimP50, 100*d))
		}
	}
	if f.HitSim == 0 && f.HitReal == 0 {
		// No reuse in the trace (Azure): nothing to compare.
	} else if d := f.HitReal - f.HitSim; !(math.Abs(d) <= 0.05) {
		m = append(m, fmt.Sprintf("prefix hit rate: real %.2f%%, simulated %.2f%% (%+.1f points)", 100*f.HitReal, 100*f.HitSim, 100*d))
	}
	if f.RealFailed > 0 {
		m = append(m, fmt.Sprintf("%d requests did not complete in the real run", f.RealFailed))
	}
	return m
}

// RunTraceTwoWay replays the first BothWaysDuration of the scenario's
// trace through real processes (binDir's modelsim, epp and gateway) on
// servers fleet servers with the scenario's policy and the prefix picker,
// and simulates the same; dir receives both outputs (real/, simulated/)
// and the processes' logs.
func RunTraceTwoWay(ctx context.Context, sc TraceScenario, servers int, binDir, dir string) (*TraceTwoWayFigures, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	pol := filepath.Join(dir, "prefix.yaml")
	if err := os.WriteFile(pol, []byte(sc.Policy), 0o644); err != nil {
		return nil, err
	}
	c := sc.config(servers)
	c.Duration, c.Policies = BothWaysDuration, []string{pol}
	s, err := c.Load()
	if err != nil {
		return nil, err
	}
	results, simSum, err := simulate.RunAll(s, c.Options(), nil)
	if err != nil {
		return nil, err
	}
	if err := writeAll(filepath.Join(dir, "simulated"), s, results, simSum); err != nil {
		return nil, err
	}

	fleet, err := realrun.StartFleet(ctx, realrun.FleetOptions{Bins: launch.InDir(binDir), Fleet: s.Fleet, Policy: pol,
		Picker: c.Picker, ScrapeInterval: c.ScrapeInterval, PrefixCacheTTL: c.PrefixCacheTTL, LogDir: filepath.Join(dir, "logs")})
	if err != nil {
		return nil, err
	}
	res, rerr := realrun.Run(ctx, s.Trace, s.Policies[0], realrun.Options{URL: fleet.URL, Servers: fleet.Servers})
	serr := fleet.Stop()
	if res == nil {
		return nil, errors.Join(rerr, serr)
	}
	realSum := simulate.NewSummary(s.Trace, s.Fleet, c.Seed, []*simulate.Result{res})
	if err := writeAll(filepath.Join(dir, "real"), s, []*simulate.Result{res}, realSum); err != nil {
		return nil, err
	}
	// Side by side in dir: the same figures, one panel each way.
	realRes, simRes := *res, *results[0]
	realPol, simPol := *res.Policy, *results[0].Policy
	realPol.Name, simPol.Name = "real", "simulated"
	realRes.Policy, simRes.Policy = &realPol, &simPol
	if _, err := simulate.WritePlots(dir, s.Trace, []*simulate.Result{&realRes, &simRes}); err != nil {
		return nil, err
	}
	rp, sp := realSum.Policies[0], simSum.Policies[0]
	f := &TraceTwoWayFigures{Source: sc.short(s.Trace.Source), Requests: len(s.Trace.Requests), Servers: servers,
		HitReal: rp.PrefixHitRate, HitSim: sp.PrefixHitRate, RealMakespanS: rp.MakespanS, SimMakespanS: sp.MakespanS,
		RealFailed: rp.Total.Requests - rp.Total.Completed}
	for i, rc := range rp.Classes {
		cs := sp.Classes[i]
		f.Classes = append(f.Classes, ClassComparison{Class: rc.Class, RealP50: rc.TTFT.P50, RealP99: rc.TTFT.P99,
			SimP50: cs.TTFT.P50, SimP99: cs.TTFT.P99, RealOK: rc.Completed, SimOK: cs.Completed})
	}
	return f, errors.Join(rerr, serr)
}

func writeAll(dir string, s *simulate.Setup, results []*simulate.Result, sum *simulate.Summary) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := simulate.WriteOutputs(dir, s.Trace, results, sum); err != nil {
		return err
	}
	_, err := simulate.WritePlots(dir, s.Trace, results)
	return err
}

// WriteTrace prints a real-trace scenario's figures.
func WriteTrace(w io.Writer, f *TraceFigures) {
	fmt.Fprintf(w, "%s: %s, %d requests over %.0f s (%.2f/s) on %d servers (saturated at %.2f/s: %.0f%% load); simulated in %.1f s\n",
		f.Name, f.Source, f.Requests, f.SpanS, f.OfferedRate, f.Servers, f.SaturatedRate, 100*f.OfferedRate/f.SaturatedRate, f.SimS)
	for _, r := range f.Rows {
		for i, c := range r.Classes {
			name, hit := "", ""
			if i == 0 {
				name, hit = r.Policy, fmt.Sprintf("hit rate %5.1f%%", 100*r.HitRate)
			}
			fmt.Fprintf(w, "  %-14s %-16s %-12s TTFT p50 %7.0f  p99 %7.0f ms\n", name, hit, c.Class, c.P50, c.P99)
		}
	}
}

// WriteTraceTwoWay prints the real-trace two-way comparison.
func WriteTraceTwoWay(w io.Writer, f *TraceTwoWayFigures) {
	fmt.Fprintf(w, "both ways, a real trace: %s, %d requests on %d servers\n", f.Source, f.Requests, f.Servers)
	for _, c := range f.Classes {
		fmt.Fprintf(w, "  %-12s TTFT p50 real %6.0f / simulated %6.0f ms (%+.1f%%)   p99 real %6.0f / simulated %6.0f ms   completed %d / %d\n",
			c.Class, c.RealP50, c.SimP50, 100*(c.RealP50/c.SimP50-1), c.RealP99, c.SimP99, c.RealOK, c.SimOK)
	}
	hit := "no prefix reuse"
	if f.HitSim > 0 {
		hit = fmt.Sprintf("prefix hit rate real %.2f%% / simulated %.2f%% (%+.2f points, %+.1f%%)",
			100*f.HitReal, 100*f.HitSim, 100*(f.HitReal-f.HitSim), 100*(f.HitReal/f.HitSim-1))
	}
	fmt.Fprintf(w, "  %s; makespan real %.1f s, simulated %.1f s\n", hit, f.RealMakespanS, f.SimMakespanS)
}
