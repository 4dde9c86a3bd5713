package demo

import (
	"fmt"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

var classColors = map[string]color.Color{
	"premium": color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	"regular": color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
}

// Plot draws cumulative completions per class over time, one panel per
// scenario side by side, and writes base.png and base.svg.
func Plot(outs []Outcome, base string) (pngPath, svgPath string, err error) {
	plots := make([]*plot.Plot, len(outs))
	for i, o := range outs {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("quanta %s (premium:regular)", o.Scenario.Name)
		p.X.Label.Text = "seconds since release"
		p.Y.Label.Text = "cumulative completions"
		p.Add(plotter.NewGrid())
		for _, class := range o.Result.Spec.Classes {
			var pts plotter.XYs
			n := 0
			pts = append(pts, plotter.XY{})
			for _, c := range o.Result.Completions {
				if c.Class == class {
					n++
					pts = append(pts, plotter.XY{X: c.At.Seconds(), Y: float64(n)})
				}
			}
			line, err := plotter.NewLine(pts)
			if err != nil {
				return "", "", err
			}
			line.Color = classColors[class]
			line.Width = vg.Points(2)
			p.Add(line)
			p.Legend.Add(class, line)
		}
		p.Legend.Top = true
		p.Legend.Left = true
		p.Y.Min = 0
		plots[i] = p
	}
	w, h := vg.Length(len(outs))*5*vg.Inch, 4*vg.Inch
	pngPath, svgPath = base+".png", base+".svg"
	if err := render(vgimg.PngCanvas{Canvas: vgimg.New(w, h)}, plots, pngPath); err != nil {
		return "", "", err
	}
	if err := render(vgsvg.New(w, h), plots, svgPath); err != nil {
		return "", "", err
	}
	return pngPath, svgPath, nil
}

type canvasWriter interface {
	vg.CanvasWriterTo
}

func render(c canvasWriter, plots []*plot.Plot, path string) error {
	dc := draw.New(c)
	tiles := draw.Tiles{Rows: 1, Cols: len(plots), PadX: vg.Millimeter * 4, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align([][]*plot.Plot{plots}, tiles, dc)
	for j, p := range plots {
		p.Draw(canvases[0][j])
	}
	return writeFile(path, c)
}
