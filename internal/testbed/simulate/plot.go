package simulate

import (
	"cmp"
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"

	"github.com/laneway-dev/laneway/internal/testbed/report"
)

// Plot names: DIR/<name>.png and DIR/<name>.svg.
const (
	PlotCompletions = "completions"
	PlotTTFT        = "ttft-cdf"
	PlotQueue       = "queue-depth"
)

// classOrder lists the class names with requests over all runs, in first
// seen order, so a class has the same colour in every panel.
func classOrder(results []*Result) []string {
	var names []string
	for _, res := range results {
		seen := make([]bool, len(res.Classes))
		for i := range res.Outcomes {
			seen[res.Outcomes[i].Class] = true
		}
		for i, ok := range seen {
			if ok && !slices.Contains(names, res.Classes[i]) {
				names = append(names, res.Classes[i])
			}
		}
	}
	return names
}

func colourOf(names []string, class string) color.Color {
	return report.Colour(slices.Index(names, class))
}

// WritePlots draws the three figures, one panel per run side by side with
// shared axes: cumulative completions per class over time, the TTFT CDF per
// class, and the queue depth per class over time (solid: the picker's
// queue; dashed: admitted to an engine but not running yet). It returns the
// files written.
func WritePlots(dir string, t *Trace, results []*Result) ([]string, error) {
	names := classOrder(results)
	t0 := t.Requests[t.byArrival[0]].Arrival
	var files []string
	for _, fig := range []struct {
		name  string
		panel func(*Result) (*plot.Plot, error)
	}{
		{PlotCompletions, func(r *Result) (*plot.Plot, error) { return completionsPanel(t0, names, r) }},
		{PlotTTFT, func(r *Result) (*plot.Plot, error) { return ttftPanel(t, names, r) }},
		{PlotQueue, func(r *Result) (*plot.Plot, error) { return queuePanel(t, t0, names, r) }},
	} {
		var plots []*plot.Plot
		for _, res := range results {
			p, err := fig.panel(res)
			if err != nil {
				return files, fmt.Errorf("plot %s of %s: %w", fig.name, res.Policy.Name, err)
			}
			plots = append(plots, p)
		}
		report.ShareAxes(plots, fig.name != PlotTTFT)
		fs, err := report.Render(filepath.Join(dir, fig.name), plots)
		files = append(files, fs...)
		if err != nil {
			return files, err
		}
	}
	return files, nil
}

// completionsPanel: cumulative completions per class against seconds
// since the first arrival.
func completionsPanel(t0 int64, names []string, res *Result) (*plot.Plot, error) {
	p := report.NewPanel(res.Policy.Name, "seconds since the first arrival", "cumulative completions")
	ends := make([][]int64, len(res.Classes))
	for i := range res.Outcomes {
		if o := &res.Outcomes[i]; o.Status == 200 {
			ends[o.Class] = append(ends[o.Class], o.End-t0)
		}
	}
	for _, name := range names {
		c := slices.Index(res.Classes, name)
		if c < 0 || len(ends[c]) == 0 {
			continue
		}
		e := ends[c]
		slices.Sort(e)
		pts := report.Cumulative(len(e), func(i int) float64 { return float64(e[i]) / 1e9 })
		if err := report.AddLine(p, pts, colourOf(names, name), name, false); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// ttftPanel: the fraction of completed requests of each class with a TTFT
// at most x, x on a log scale when the TTFTs span more than two decades.
func ttftPanel(t *Trace, names []string, res *Result) (*plot.Plot, error) {
	p := report.NewPanel(res.Policy.Name, "time to first token (ms)", "fraction of requests")
	ttft := make([][]float64, len(res.Classes))
	lo, hi := math.Inf(1), 0.0
	for i := range res.Outcomes {
		if o := &res.Outcomes[i]; o.Status == 200 {
			v := float64(o.First-t.Requests[i].Arrival) / 1e6
			v = max(v, 1e-3)
			ttft[o.Class] = append(ttft[o.Class], v)
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	if hi > 0 && hi/lo > 100 {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
		p.X.Label.Text += ", log scale"
	}
	for _, name := range names {
		c := slices.Index(res.Classes, name)
		if c < 0 || len(ttft[c]) == 0 {
			continue
		}
		v := ttft[c]
		slices.Sort(v)
		var pts plotter.XYs
		step := max(1, len(v)/report.MaxPoints)
		for i := 0; i < len(v); i += step {
			pts = append(pts, plotter.XY{X: v[i], Y: float64(i+1) / float64(len(v))})
		}
		pts = append(pts, plotter.XY{X: v[len(v)-1], Y: 1})
		if err := report.AddLine(p, pts, colourOf(names, name), name, false); err != nil {
			return nil, err
		}
	}
	p.Y.Min, p.Y.Max = 0, 1
	return p, nil
}

// queuePanel: per class, the requests in the picker's queue (arrival to
// dispatch) and those dispatched but waiting in their engine (dispatch to
// admission), as the largest depth within each of report.MaxPoints time slices.
func queuePanel(t *Trace, t0 int64, names []string, res *Result) (*plot.Plot, error) {
	p := report.NewPanel(res.Policy.Name, "seconds since the first arrival", "requests waiting")
	p.Legend.Left = false // the depths start high on the left
	end := t0
	for i := range res.Outcomes {
		end = max(end, res.Outcomes[i].End, res.Outcomes[i].Leave)
	}
	span := max(end-t0, 1)
	slice := func(at int64) int { return min(int((at-t0)*report.MaxPoints/span), report.MaxPoints-1) }
	for _, name := range names {
		c := slices.Index(res.Classes, name)
		if c < 0 {
			continue
		}
		for _, engineSide := range []bool{false, true} {
			type step struct {
				at    int64
				delta int
			}
			var steps []step
			for i := range res.Outcomes {
				o := &res.Outcomes[i]
				if int(o.Class) != c {
					continue
				}
				from, to := t.Requests[i].Arrival, o.Leave
				if engineSide {
					if o.Server < 0 {
						continue
					}
					from, to = o.Leave, o.Start
				}
				if to < 0 || to <= from {
					continue
				}
				steps = append(steps, step{from, 1}, step{to, -1})
			}
			if len(steps) == 0 {
				continue
			}
			slices.SortFunc(steps, func(a, b step) int {
				if a.at != b.at {
					return cmp.Compare(a.at, b.at)
				}
				return a.delta - b.delta
			})
			peak := make([]int, report.MaxPoints)
			depth := 0
			for _, s := range steps {
				depth += s.delta
				if k := slice(s.at); depth > peak[k] {
					peak[k] = depth
				}
			}
			// A slice with no step keeps the depth of the one before.
			pts := make(plotter.XYs, report.MaxPoints)
			depth = 0
			si := 0
			for k := range report.MaxPoints {
				v := peak[k]
				for si < len(steps) && slice(steps[si].at) <= k {
					depth += steps[si].delta
					si++
				}
				pts[k] = plotter.XY{X: float64(int64(k)*span/report.MaxPoints) / 1e9, Y: float64(max(v, depth))}
			}
			label := name + " (picker)"
			if engineSide {
				label = name + " (engines)"
			}
			if err := report.AddLine(p, pts, colourOf(names, name), label, engineSide); err != nil {
				return nil, err
			}
		}
	}
	p.Y.Min = 0
	return p, nil
}
