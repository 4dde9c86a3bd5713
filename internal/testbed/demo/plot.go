package demo

import (
	"fmt"
	"slices"

	"gonum.org/v1/plot"

	"github.com/laneway-dev/laneway/internal/testbed/report"
)

// Plot draws cumulative completions per class over time, one panel per
// scenario side by side, and writes base.png and base.svg.
func Plot(outs []Outcome, base string) (pngPath, svgPath string, err error) {
	plots := make([]*plot.Plot, len(outs))
	for i, o := range outs {
		p := report.NewPanel(fmt.Sprintf("quanta %s (premium:regular)", o.Scenario.Name),
			"seconds since release", "cumulative completions")
		for ci, class := range o.Result.Spec.Classes {
			var at []float64
			for _, c := range o.Result.Completions {
				if c.Class == class {
					at = append(at, c.At.Seconds())
				}
			}
			slices.Sort(at)
			pts := report.Cumulative(len(at), func(i int) float64 { return at[i] })
			if err := report.AddLine(p, pts, report.Colour(ci), class, false); err != nil {
				return "", "", err
			}
		}
		p.Y.Min = 0
		plots[i] = p
	}
	files, err := report.Render(base, plots)
	if err != nil {
		return "", "", err
	}
	return files[0], files[1], nil
}
