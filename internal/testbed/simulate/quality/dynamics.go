package quality

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"

	"github.com/laneway-dev/laneway/internal/testbed/report"
	"github.com/laneway-dev/laneway/internal/testbed/simulate"
	"github.com/laneway-dev/laneway/pkg/engine"
	"github.com/laneway-dev/laneway/pkg/policy"
)

// The auto threshold's dynamics (issue 26): one server, the two classes
// of AutoTwoClassPolicy, and a change every dynamicsPhase: a load step
// (the rate doubled, then halved back) and an engine change (the server
// restarted with half its max_num_batched_tokens, then back). The server
// has 16 sequences, so that its own waiting queue shows the load and the
// threshold has something to follow.
const (
	dynamicsPhase = 20 * time.Second
	// MaxSettle is how long after a change the threshold may still move.
	MaxSettle = 5 * time.Second
)

func dynamicsEngine() engine.Config {
	c := engine.DefaultConfig()
	c.MaxNumSeqs = 16
	c.EnablePrefixCaching = false
	return c
}

// dynamicsShape is the requests' shape; dynamicsRate the base rate
// (requests/s, 4 interactive to 1 batch), about 80% of what the server
// serves, so the doubled rate overloads it.
const (
	dynamicsInter = "prompt=100-400,output=~64"
	dynamicsBatch = "prompt=1000-3000,output=~128"
	dynamicsRate  = 7.0
)

// DynamicsRun is one run of the dynamics: the threshold after each
// scrape, the times of the changes and how long after each the threshold
// last moved.
type DynamicsRun struct {
	Name    string
	Points  []simulate.ThresholdPoint
	Changes []time.Duration
	Settle  []time.Duration
	// Levels is the threshold in force just before each change and at the
	// end of the run.
	Levels []uint64
}

// DynamicsFigures are both runs.
type DynamicsFigures struct {
	LoadStep, EngineChange DynamicsRun
}

// Misses lists the changes after which the threshold took longer than
// MaxSettle to settle.
func (f *DynamicsFigures) Misses() []string {
	var m []string
	for _, r := range []DynamicsRun{f.LoadStep, f.EngineChange} {
		for i, s := range r.Settle {
			if s > MaxSettle {
				m = append(m, fmt.Sprintf("%s: the threshold moved %.1f s after the change at %s, want within %s", r.Name, s.Seconds(), r.Changes[i], MaxSettle))
			}
		}
	}
	return m
}

// RunDynamics runs both and draws them into dir when dir is not empty:
// auto-threshold-load-step and auto-threshold-engine-change, PNG and SVG.
func RunDynamics(dir string) (*DynamicsFigures, error) {
	cfg, err := policy.LoadYAML([]byte(AutoTwoClassPolicy))
	if err != nil {
		return nil, err
	}
	pol, err := simulate.NewPolicy("auto", cfg, simulate.PickerPrefix)
	if err != nil {
		return nil, err
	}
	stream := func(class, shape string, rate float64, start, d time.Duration) string {
		return fmt.Sprintf("class=%s,rate=%.2f,%s,start=%s,duration=%s", class, rate, shape, start, d)
	}
	base := func(d time.Duration) string {
		return stream("interactive", dynamicsInter, 0.8*dynamicsRate, 0, d) + ";" + stream("batch", dynamicsBatch, 0.2*dynamicsRate, 0, d)
	}
	// Load step: the base rate for three phases, the same again during
	// the second.
	step := base(3*dynamicsPhase) + ";" + stream("interactive", dynamicsInter, 0.8*dynamicsRate, dynamicsPhase, dynamicsPhase) +
		";" + stream("batch", dynamicsBatch, 0.2*dynamicsRate, dynamicsPhase, dynamicsPhase)
	f := &DynamicsFigures{}
	ec := dynamicsEngine()
	if f.LoadStep, err = runDynamics("load step (rate doubled at 20 s, halved at 40 s)", step, ec, pol, nil,
		[]time.Duration{dynamicsPhase, 2 * dynamicsPhase}); err != nil {
		return nil, err
	}
	half := ec
	half.MaxNumBatchedTokens /= 2
	restarts := []simulate.Restart{{After: dynamicsPhase, Engine: half}, {After: 2 * dynamicsPhase, Engine: ec}}
	// The engine change runs at the doubled rate, so that the server is
	// saturated throughout.
	busy := base(3*dynamicsPhase) + ";" + base(3*dynamicsPhase)
	if f.EngineChange, err = runDynamics("engine change (max_num_batched_tokens 8192, 4096 from 20 s, 8192 from 40 s)", busy, ec, pol, restarts,
		[]time.Duration{dynamicsPhase, 2 * dynamicsPhase}); err != nil {
		return nil, err
	}
	if dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		for _, d := range []struct {
			name  string
			run   DynamicsRun
			title string
		}{{"auto-threshold-load-step", f.LoadStep, "load step: rate x2 at 20 s, back at 40 s"},
			{"auto-threshold-engine-change", f.EngineChange, "restart: step budget 4096 at 20 s, 8192 at 40 s"}} {
			if _, err := drawDynamics(filepath.Join(dir, d.name), d.title, d.run); err != nil {
				return nil, err
			}
		}
	}
	return f, nil
}

func runDynamics(name, spec string, ec engine.Config, pol *simulate.Policy, restarts []simulate.Restart, changes []time.Duration) (DynamicsRun, error) {
	run := DynamicsRun{Name: name, Changes: changes}
	t, err := simulate.Generate(spec, 1)
	if err != nil {
		return run, err
	}
	fleet, err := simulate.NewFleet(1, ec)
	if err != nil {
		return run, err
	}
	res, err := simulate.Run(t, fleet, pol, simulate.Options{Seed: 1, ScrapeInterval: 100 * time.Millisecond, Restarts: restarts})
	if err != nil {
		return run, err
	}
	if len(res.Thresholds) == 0 {
		return run, fmt.Errorf("%s: no threshold recorded", name)
	}
	t0 := t.Requests[0].Arrival
	for _, p := range res.Thresholds[0] {
		p.At -= t0
		run.Points = append(run.Points, p)
	}
	// For each change: the last move before the next change, or before
	// the arrivals end (the drain after it is no load to follow).
	bounds := append(append([]time.Duration{}, changes...), 3*dynamicsPhase)
	for i, c := range changes {
		last, level := c, uint64(0)
		for j := 1; j < len(run.Points); j++ {
			at := time.Duration(run.Points[j].At)
			if at < c {
				level = run.Points[j].Threshold
				continue
			}
			if at >= bounds[i+1] {
				break
			}
			if run.Points[j].Threshold != run.Points[j-1].Threshold {
				last = at
			}
		}
		run.Settle = append(run.Settle, last-c)
		run.Levels = append(run.Levels, level)
	}
	run.Levels = append(run.Levels, run.Points[len(run.Points)-1].Threshold)
	return run, nil
}

// drawDynamics draws a run's threshold and the engine's waiting queue (in
// requests × 512, on the same token axis) over time.
func drawDynamics(base, title string, r DynamicsRun) ([]string, error) {
	p := report.NewPanel(title, "seconds since the first arrival", "tokens")
	th := make(plotter.XYs, 0, len(r.Points))
	wq := make(plotter.XYs, 0, len(r.Points))
	for _, pt := range r.Points {
		x := float64(pt.At) / 1e9
		th = append(th, plotter.XY{X: x, Y: float64(pt.Threshold)})
		wq = append(wq, plotter.XY{X: x, Y: float64(pt.Waiting) * 512})
	}
	if err := report.AddLine(p, th, report.Colour(0), "auto threshold", false); err != nil {
		return nil, err
	}
	if err := report.AddLine(p, wq, report.Colour(1), "engine waiting queue × 512", true); err != nil {
		return nil, err
	}
	return report.Render(base, []*plot.Plot{p})
}
