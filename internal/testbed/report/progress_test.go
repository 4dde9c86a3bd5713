package report

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func newTestProgress(terminal bool) (*Progress, *bytes.Buffer, *fakeClock) {
	var out bytes.Buffer
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := NewProgress(&out, "run")
	p.terminal, p.start, p.now = terminal, clk.t, clk.now
	return p, &out, clk
}

// TestProgressNotTerminal: into a file or a pipe, one line per 10% step,
// none in the first second, none more for the same step.
func TestProgressNotTerminal(t *testing.T) {
	p, out, clk := newTestProgress(false)
	p.Update(5, 100) // within the first second: nothing
	clk.t = clk.t.Add(2 * time.Second)
	for _, done := range []int{5, 9, 10, 19, 25, 100} {
		p.Update(done, 100)
	}
	p.Finish()
	bar := func(fill int) string { return strings.Repeat("#", fill) + strings.Repeat(".", barWidth-fill) }
	want := "  run            [" + bar(2) + "]   5% 5/100 requests, 2s\n" +
		"  run            [" + bar(4) + "]  10% 10/100 requests, 2s\n" +
		"  run            [" + bar(10) + "]  25% 25/100 requests, 2s\n" +
		"  run            [" + bar(40) + "] 100% 100/100 requests, 2s\n"
	if out.String() != want {
		t.Errorf("got\n%q\nwant\n%q", out.String(), want)
	}
}

// TestProgressTerminal: on a terminal the bar is redrawn in place when the
// percentage or the whole seconds change, and Finish ends its line.
func TestProgressTerminal(t *testing.T) {
	p, out, clk := newTestProgress(true)
	clk.t = clk.t.Add(time.Second)
	p.Update(1, 4)
	p.Update(1, 4) // nothing changed
	clk.t = clk.t.Add(time.Second)
	p.Update(1, 4) // a second more
	p.Update(4, 4)
	p.Finish()
	got := strings.Split(out.String(), "\r")
	want := []string{"", "25% 1/4 requests, 1s", "25% 1/4 requests, 2s", "100% 4/4 requests, 2s\n"}
	if len(got) != len(want) {
		t.Fatalf("%d draws %q, want %d", len(got)-1, out.String(), len(want)-1)
	}
	for i := 1; i < len(want); i++ {
		if !strings.HasSuffix(got[i], want[i]) {
			t.Errorf("draw %d: %q, want it to end in %q", i, got[i], want[i])
		}
	}
}

// TestProgressQuiet: a run shorter than a second, and a nil writer, show
// nothing.
func TestProgressQuiet(t *testing.T) {
	p, out, _ := newTestProgress(false)
	p.Update(100, 100)
	p.Finish()
	if out.Len() != 0 {
		t.Errorf("a run of less than a second wrote %q", out.String())
	}
	q := NewProgress(nil, "run")
	q.start = time.Time{}
	q.Update(1, 2)
	q.Finish()
}
