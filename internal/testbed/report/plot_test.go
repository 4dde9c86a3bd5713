package report

import (
	"os"
	"path/filepath"
	"testing"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
)

func TestCumulative(t *testing.T) {
	x := func(i int) float64 { return float64(i) / 10 }
	if got := Cumulative(0, x); len(got) != 1 || got[0] != (plotter.XY{}) {
		t.Errorf("no events: %v, want only the origin", got)
	}
	if got, want := Cumulative(3, x), (plotter.XYs{{}, {X: 0, Y: 1}, {X: 0.1, Y: 2}, {X: 0.2, Y: 3}}); !equalXYs(got, want) {
		t.Errorf("3 events: %v, want %v", got, want)
	}
	// Thinned: every step-th event, and the last one.
	n := 3*MaxPoints + 1
	got := Cumulative(n, x)
	if len(got) != MaxPoints+2 {
		t.Errorf("%d events: %d points, want %d", n, len(got), MaxPoints+2)
	}
	if last := got[len(got)-1]; last.Y != float64(n) || last.X != x(n-1) {
		t.Errorf("%d events: last point %v, want the last event", n, last)
	}
}

func equalXYs(a, b plotter.XYs) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestRender: two panels with shared axes become a PNG and an SVG.
func TestRender(t *testing.T) {
	a, b := NewPanel("a", "x", "y"), NewPanel("b", "x", "y")
	if err := AddLine(a, plotter.XYs{{X: 0, Y: 0}, {X: 1, Y: 2}}, Colour(0), "first", false); err != nil {
		t.Fatal(err)
	}
	if err := AddLine(b, plotter.XYs{{X: 0, Y: 0}, {X: 3, Y: 1}}, Colour(9), "second", true); err != nil {
		t.Fatal(err)
	}
	if err := AddLine(b, nil, Colour(1), "empty", false); err != nil {
		t.Fatal(err)
	}
	ShareAxes([]*plot.Plot{a, b}, true)
	if a.X.Max != 3 || b.Y.Max != 2.5 {
		t.Errorf("shared axes: x max %v, y max %v; want 3 and 2.5 (2, and a fifth of the height for the legend)", a.X.Max, b.Y.Max)
	}
	base := filepath.Join(t.TempDir(), "fig")
	files, err := Render(base, []*plot.Plot{a, b})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 || files[0] != base+".png" || files[1] != base+".svg" {
		t.Fatalf("files %v", files)
	}
	for _, f := range files {
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
}
