package simulate

import (
	"cmp"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Plot names: DIR/<name>.png and DIR/<name>.svg.
const (
	PlotCompletions = "completions"
	PlotTTFT        = "ttft-cdf"
	PlotQueue       = "queue-depth"
)

// maxPoints bounds the points of one line: a million-request run plots as
// fast as a small one, and looks the same at this resolution.
const maxPoints = 1500

// palette colours classes in the order they appear.
var palette = []color.Color{
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
	color.RGBA{R: 0xe3, G: 0x77, B: 0xc2, A: 0xff},
	color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff},
}

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
	return palette[slices.Index(names, class)%len(palette)]
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
		shareAxes(plots, fig.name != PlotTTFT)
		fs, err := render(filepath.Join(dir, fig.name), plots)
		files = append(files, fs...)
		if err != nil {
			return files, err
		}
	}
	return files, nil
}

func newPanel(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	p.Legend.Left = true
	return p
}

func addLine(p *plot.Plot, pts plotter.XYs, c color.Color, label string, dashed bool) error {
	if len(pts) == 0 {
		return nil
	}
	l, err := plotter.NewLine(pts)
	if err != nil {
		return err
	}
	l.Color = c
	l.Width = vg.Points(1.8)
	if dashed {
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	}
	p.Add(l)
	if label != "" {
		p.Legend.Add(label, l)
	}
	return nil
}

// completionsPanel: cumulative completions per class against seconds
// since the first arrival.
func completionsPanel(t0 int64, names []string, res *Result) (*plot.Plot, error) {
	p := newPanel(res.Policy.Name, "seconds since the first arrival", "cumulative completions")
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
		pts := plotter.XYs{{}}
		step := max(1, len(e)/maxPoints)
		for i := step - 1; i < len(e); i += step {
			pts = append(pts, plotter.XY{X: float64(e[i]) / 1e9, Y: float64(i + 1)})
		}
		if last := len(e) - 1; (last+1)%step != 0 {
			pts = append(pts, plotter.XY{X: float64(e[last]) / 1e9, Y: float64(last + 1)})
		}
		if err := addLine(p, pts, colourOf(names, name), name, false); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// ttftPanel: the fraction of completed requests of each class with a TTFT
// at most x, x on a log scale when the TTFTs span more than two decades.
func ttftPanel(t *Trace, names []string, res *Result) (*plot.Plot, error) {
	p := newPanel(res.Policy.Name, "time to first token (ms)", "fraction of requests")
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
		step := max(1, len(v)/maxPoints)
		for i := 0; i < len(v); i += step {
			pts = append(pts, plotter.XY{X: v[i], Y: float64(i+1) / float64(len(v))})
		}
		pts = append(pts, plotter.XY{X: v[len(v)-1], Y: 1})
		if err := addLine(p, pts, colourOf(names, name), name, false); err != nil {
			return nil, err
		}
	}
	p.Y.Min, p.Y.Max = 0, 1
	return p, nil
}

// queuePanel: per class, the requests in the picker's queue (arrival to
// dispatch) and those dispatched but waiting in their engine (dispatch to
// admission), as the largest depth within each of maxPoints time slices.
func queuePanel(t *Trace, t0 int64, names []string, res *Result) (*plot.Plot, error) {
	p := newPanel(res.Policy.Name, "seconds since the first arrival", "requests waiting")
	p.Legend.Left = false // the depths start high on the left
	end := t0
	for i := range res.Outcomes {
		end = max(end, res.Outcomes[i].End, res.Outcomes[i].Leave)
	}
	span := max(end-t0, 1)
	slice := func(at int64) int { return min(int((at-t0)*maxPoints/span), maxPoints-1) }
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
			peak := make([]int, maxPoints)
			depth := 0
			for _, s := range steps {
				depth += s.delta
				if k := slice(s.at); depth > peak[k] {
					peak[k] = depth
				}
			}
			// A slice with no step keeps the depth of the one before.
			pts := make(plotter.XYs, maxPoints)
			depth = 0
			si := 0
			for k := range maxPoints {
				v := peak[k]
				for si < len(steps) && slice(steps[si].at) <= k {
					depth += steps[si].delta
					si++
				}
				pts[k] = plotter.XY{X: float64(int64(k)*span/maxPoints) / 1e9, Y: float64(max(v, depth))}
			}
			label := name + " (picker)"
			if engineSide {
				label = name + " (engines)"
			}
			if err := addLine(p, pts, colourOf(names, name), label, engineSide); err != nil {
				return nil, err
			}
		}
	}
	p.Y.Min = 0
	return p, nil
}

// shareAxes gives every panel the same ranges, so heights and times
// compare across panels; headroom leaves the top fifth for the legend.
func shareAxes(ps []*plot.Plot, headroom bool) {
	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, p := range ps {
		xmin, xmax = min(xmin, p.X.Min), max(xmax, p.X.Max)
		ymin, ymax = min(ymin, p.Y.Min), max(ymax, p.Y.Max)
	}
	if headroom {
		ymax += (ymax - ymin) / 4
	}
	for _, p := range ps {
		p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = xmin, xmax, ymin, ymax
	}
}

// render writes base.png and base.svg with the panels in one row.
func render(base string, plots []*plot.Plot) ([]string, error) {
	w, h := vg.Length(len(plots))*5*vg.Inch, 4*vg.Inch
	var files []string
	for _, out := range []struct {
		path string
		c    vg.CanvasWriterTo
	}{
		{base + ".png", vgimg.PngCanvas{Canvas: vgimg.New(w, h)}},
		{base + ".svg", vgsvg.New(w, h)},
	} {
		dc := draw.New(out.c)
		tiles := draw.Tiles{Rows: 1, Cols: len(plots), PadX: vg.Millimeter * 4, PadTop: vg.Millimeter * 2,
			PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
		canvases := plot.Align([][]*plot.Plot{plots}, tiles, dc)
		for j, p := range plots {
			p.Draw(canvases[0][j])
		}
		f, err := os.Create(out.path)
		if err != nil {
			return files, fmt.Errorf("plot: %w", err)
		}
		_, werr := out.c.WriteTo(f)
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return files, fmt.Errorf("plot %s: %w", out.path, werr)
		}
		files = append(files, out.path)
	}
	return files, nil
}
