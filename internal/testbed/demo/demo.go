package demo

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/internal/testbed/report"
	"github.com/laneway-dev/laneway/internal/testbed/simulate"
	"github.com/laneway-dev/laneway/internal/testbed/workload"
	"github.com/laneway-dev/laneway/pkg/policy"
)

// readyTimeout bounds each process's start-up wait.
const readyTimeout = 30 * time.Second

// Config says where the binaries are and how big the run is.
type Config struct {
	// BinDir holds epp, modelsim and gateway.
	BinDir string
	// OutDir receives the policy files, logs and plots.
	OutDir string
	// PerClass is the requests per class (320 in SPEC §11).
	PerClass int
	// HeaderOnly runs the gateway with --response-phases=false: the
	// picker sees each request but never its response, as behind
	// gateways that send no response phase.
	HeaderOnly bool
	// Threshold is both classes' prefill_busy_threshold: "" is auto (the
	// default of a class that writes none), or SPEC §11's 1536, or any
	// token count.
	Threshold string
	// Out receives the table; Progress receives the progress of each run
	// (report.Progress: a bar on a terminal, a line at every 10% elsewhere).
	Out, Progress io.Writer
}

// Scenario is one run: the quanta of premium and regular.
type Scenario struct {
	Name                    string
	PremiumQuantum, Regular uint64
	Weighted                bool
}

// Scenarios are the weighted run and its equal-share control.
var Scenarios = []Scenario{
	{Name: "512:128", PremiumQuantum: 512, Regular: 128, Weighted: true},
	{Name: "512:512", PremiumQuantum: 512, Regular: 512, Weighted: false},
}

// Outcome is one scenario's result.
type Outcome struct {
	Scenario Scenario
	Result   *workload.Result
	Shares   workload.Shares
	// Prediction is laneway simulate's forecast of the same run: the
	// picker's own core in virtual time with the engine model of the
	// demo's modelsim.
	Prediction simulate.Prediction
	Misses     []string
	// EngineWaitingMax is the largest vllm:num_requests_waiting the
	// model server reported during the run (sampled).
	EngineWaitingMax float64
}

// MaxPredictionMiss bounds how far the measured premium count in the first
// PerClass completions may lie from the simulator's prediction. Counts,
// not times: the demo must not flake on a loaded machine.
const MaxPredictionMiss = 6

// Run runs every scenario, prints the table and writes the plots. It
// returns an error when a scenario misses its bands.
func Run(ctx context.Context, cfg Config) ([]Outcome, error) {
	if err := os.MkdirAll(cfg.OutDir, 0o755); err != nil {
		return nil, err
	}
	var outs []Outcome
	for i, sc := range Scenarios {
		o, err := runScenario(ctx, cfg, sc, i)
		if err != nil {
			return outs, fmt.Errorf("scenario %s: %w", sc.Name, err)
		}
		outs = append(outs, o)
	}
	printTable(cfg.Out, outs)
	png, svg, err := Plot(outs, filepath.Join(cfg.OutDir, "weighted-share"))
	if err != nil {
		return outs, fmt.Errorf("plot: %w", err)
	}
	fmt.Fprintf(cfg.Out, "\nplot: %s\n      %s\n", png, svg)
	var bad []string
	for _, o := range outs {
		for _, m := range o.Misses {
			bad = append(bad, o.Scenario.Name+": "+m)
		}
	}
	if len(bad) > 0 {
		return outs, fmt.Errorf("outside the SPEC §11 bands or the simulator's prediction:\n  %s", strings.Join(bad, "\n  "))
	}
	fmt.Fprintln(cfg.Out, "\nboth runs are inside the SPEC §11 bands and agree with the simulator.")
	return outs, nil
}

func runScenario(ctx context.Context, cfg Config, sc Scenario, n int) (o Outcome, err error) {
	o.Scenario = sc
	dir := filepath.Join(cfg.OutDir, strings.ReplaceAll(sc.Name, ":", "-"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return o, err
	}
	policyFile := filepath.Join(dir, "policy.yaml")
	threshold := cmp.Or(cfg.Threshold, policy.BusyAuto)
	if err := os.WriteFile(policyFile, []byte(workload.PolicyYAMLThreshold(sc.PremiumQuantum, sc.Regular, threshold)), 0o644); err != nil {
		return o, err
	}
	var procs []*launch.Proc
	defer func() {
		for i := len(procs) - 1; i >= 0; i-- {
			if serr := procs[i].Stop(10 * time.Second); serr != nil && err == nil {
				err = fmt.Errorf("%w\n%s", serr, procs[i].Log.Tail(2000))
			}
			_ = os.WriteFile(filepath.Join(dir, procs[i].Name+".log"), []byte(procs[i].Log.String()), 0o644)
		}
	}()
	// The head of a chatty log is what explains a failure; 1 MiB of it is
	// plenty. Each process is named after its log file.
	proc := func(name string) launch.ProcOptions {
		return launch.ProcOptions{Name: name, LogLimit: 1 << 20, ReadyTimeout: readyTimeout}
	}
	bins := launch.InDir(cfg.BinDir)
	sim, err := bins.StartSim(ctx, launch.SimOptions{
		Host: "127.0.0.2",
		// The engine the prediction simulates, so the two runs compare.
		Args: simulate.DemoEngine().Args(),
		Proc: proc(launch.CmdModelsim),
	})
	if err != nil {
		return o, err
	}
	procs = append(procs, sim.Proc)
	epp, err := bins.StartEPP(ctx, launch.EPPOptions{
		Endpoints: []string{sim.Addr},
		Policy:    policyFile,
		TLS:       true,
		Args:      []string{"--max-num-batched-tokens=8192"},
		Proc:      proc(launch.CmdEpp),
	})
	if err != nil {
		return o, err
	}
	procs = append(procs, epp.Proc)
	gw, err := bins.StartGateway(ctx, launch.GatewayOptions{EPP: epp, HeaderOnly: cfg.HeaderOnly, Proc: proc(launch.CmdGateway)})
	if err != nil {
		return o, err
	}
	procs = append(procs, gw.Proc)

	fmt.Fprintf(cfg.Out, "\n== quanta %s (premium:regular): %d + %d requests of 512 tokens, one model server with 4 slots, prefill_busy_threshold %s\n",
		sc.Name, cfg.PerClass, cfg.PerClass, threshold)
	bar := report.NewProgress(cfg.Progress, sc.Name)
	waiting := sim.Metrics.WatchMax(20*time.Millisecond, "vllm:num_requests_waiting")
	res, err := workload.Run(ctx, workload.Spec{
		URL:          gw.URL + "/v1/completions",
		Model:        "sim-model",
		Classes:      []string{"premium", "regular"},
		PerClass:     cfg.PerClass,
		PromptTokens: 512,
		Seed:         n,
		Progress:     bar.Update,
	})
	bar.Finish()
	o.EngineWaitingMax, _, _ = waiting.Stop()
	if err != nil {
		return o, err
	}
	fmt.Fprintf(cfg.Out, "   model server waiting queue: at most %v requests (vllm:num_requests_waiting, sampled every 20ms)\n", o.EngineWaitingMax)
	o.Result = res
	o.Shares = workload.Analyze(res)
	// The picker's own count, next to what the clients saw: every request
	// is dispatched once.
	m, err := epp.Metrics.Scrape(ctx)
	if err != nil {
		return o, err
	}
	fmt.Fprintf(cfg.Out, "   picker dispatched premium %v, regular %v (laneway_dispatches_total)\n",
		m.Value("laneway_dispatches_total", "policy_class", "premium"), m.Value("laneway_dispatches_total", "policy_class", "regular"))
	if cfg.PerClass == 320 {
		o.Misses = o.Shares.Check(sc.Weighted)
	}
	if o.Prediction, err = simulate.PredictWeightedShareThreshold(sc.PremiumQuantum, sc.Regular, cfg.PerClass, threshold); err != nil {
		return o, fmt.Errorf("simulate the run: %w", err)
	}
	if m := predictionMiss(cfg.PerClass, o.Shares.FirstInPrefix, o.Prediction.FirstInPrefix); m != "" {
		o.Misses = append(o.Misses, m)
	}
	for _, c := range res.Completions {
		if c.Err != nil {
			fmt.Fprintf(cfg.Out, "   first failure: %s: %v\n", c.Class, c.Err)
			break
		}
	}
	return o, nil
}

func printTable(w io.Writer, outs []Outcome) {
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%-9s | %-28s | %-26s | %-8s | %s\n", "quanta", "first 320 (premium:regular)", "regular left at premium drain", "all 200", "time")
	fmt.Fprintf(w, "%s\n", strings.Repeat("-", 100))
	defer printPredictions(w, outs)
	for _, o := range outs {
		s := o.Shares
		band := "want premium >= 240, regular >= 48"
		left := "want [220, 260]"
		if !o.Scenario.Weighted {
			band, left = "want premium in [140, 180]", "want <= 20"
		}
		fmt.Fprintf(w, "%-9s | %3d : %-3d (%s) | %3d (%s) | %d/%d | %.1fs\n",
			o.Scenario.Name, s.FirstInPrefix, s.SecondInPrefix, band, s.SecondLeftAtFirstDrain, left,
			s.OK, s.OK+s.Failed, o.Result.Elapsed.Seconds())
	}
	fmt.Fprintln(w, "reference router (4 runs): 512:512 -> 159-161 : 159-161, 0-3 left; 512:128 -> 254-257 : 63-66, 237-240 left")
}

// predictionMiss says how the measured premium count in the first perClass
// completions misses the simulator's prediction, or "" within
// MaxPredictionMiss.
func predictionMiss(perClass, measured, predicted int) string {
	if d := measured - predicted; d > MaxPredictionMiss || d < -MaxPredictionMiss {
		return fmt.Sprintf("premium in the first %d: measured %d, simulator predicted %d (want within ±%d)",
			perClass, measured, predicted, MaxPredictionMiss)
	}
	return ""
}

// printPredictions puts the simulator's forecast under the measured runs:
// the same columns, predicted by laneway simulate.
func printPredictions(w io.Writer, outs []Outcome) {
	fmt.Fprintf(w, "\nlaneway simulate predicted (the picker's core in virtual time; premium must agree within ±%d):\n", MaxPredictionMiss)
	for _, o := range outs {
		p := o.Prediction
		fmt.Fprintf(w, "%-9s | %3d : %-3d (measured %3d : %-3d) | %3d left (measured %3d) | makespan %.1fs (measured %.1fs)\n",
			o.Scenario.Name, p.FirstInPrefix, p.SecondInPrefix, o.Shares.FirstInPrefix, o.Shares.SecondInPrefix,
			p.SecondLeftAtFirstDrain, o.Shares.SecondLeftAtFirstDrain, p.Makespan.Seconds(), o.Result.Elapsed.Seconds())
	}
}
