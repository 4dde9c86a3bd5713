package report

import (
	"fmt"
	"image/color"
	"math"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// MaxPoints bounds the points of one line: a million-request run plots as
// fast as a small one, and looks the same at this resolution.
const MaxPoints = 1500

// palette colours series in the order they are named.
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

// Colour is the colour of the i-th series (a class, in the order the
// figure lists them); it repeats after eight.
func Colour(i int) color.Color { return palette[max(i, 0)%len(palette)] }

// NewPanel returns an empty panel with a grid, a title, axis labels and
// its legend at the top left.
func NewPanel(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	p.Legend.Left = true
	return p
}

// AddLine draws pts on p in colour c, dashed or solid, with a legend entry
// when label is not empty. An empty line adds nothing.
func AddLine(p *plot.Plot, pts plotter.XYs, c color.Color, label string, dashed bool) error {
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

// Cumulative is the line of a running count: from (0, 0), the count i+1
// at x(i) for n events whose x(i) do not decrease, thinned to about
// MaxPoints points and always ending at the last event.
func Cumulative(n int, x func(i int) float64) plotter.XYs {
	pts := plotter.XYs{{}}
	step := max(1, n/MaxPoints)
	for i := step - 1; i < n; i += step {
		pts = append(pts, plotter.XY{X: x(i), Y: float64(i + 1)})
	}
	if last := n - 1; last >= 0 && (last+1)%step != 0 {
		pts = append(pts, plotter.XY{X: x(last), Y: float64(last + 1)})
	}
	return pts
}

// ShareAxes gives every panel the same ranges, so heights and times
// compare across panels; headroom leaves the top fifth for the legend.
func ShareAxes(ps []*plot.Plot, headroom bool) {
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

// Render writes base.png and base.svg with the panels in one row, 5 by 4
// inches each, and returns the files it wrote.
func Render(base string, plots []*plot.Plot) ([]string, error) {
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
