package report

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Progress shows how far a run is, on a writer meant for people (stderr):
// on a terminal one bar redrawn in place, elsewhere (a file, a pipe, a CI
// log) one line at each 10% step. Nothing shows before the run has taken a
// second, so a short run leaves its output clean. A Progress on a nil
// writer draws nothing. It is not safe for concurrent use.
type Progress struct {
	w        io.Writer
	label    string
	terminal bool
	start    time.Time
	now      func() time.Time
	// What the last line showed: its step (the percentage, in tens when
	// not on a terminal) and, on a terminal, the whole seconds elapsed.
	drawn             bool
	lastStep, lastSec int
}

// isTerminal reports whether w is a character device.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// NewProgress starts the clock of a run named label.
func NewProgress(w io.Writer, label string) *Progress {
	return &Progress{w: w, label: label, terminal: w != nil && isTerminal(w), start: time.Now(), now: time.Now}
}

// barWidth is the bar's length in characters.
const barWidth = 40

// Update reports that done of total requests have finished.
func (p *Progress) Update(done, total int) {
	if p.w == nil || total <= 0 {
		return
	}
	elapsed := p.now().Sub(p.start)
	if elapsed < time.Second {
		return
	}
	done = min(max(done, 0), total)
	pct := done * 100 / total
	step, sec := pct, int(elapsed/time.Second)
	if !p.terminal {
		step = pct / 10 * 10
	}
	if p.drawn && step == p.lastStep && (!p.terminal || sec == p.lastSec) {
		return
	}
	p.drawn, p.lastStep, p.lastSec = true, step, sec
	fill := done * barWidth / total
	line := fmt.Sprintf("  %-14s [%s%s] %3d%% %d/%d requests, %ds", p.label,
		strings.Repeat("#", fill), strings.Repeat(".", barWidth-fill), pct, done, total, sec)
	if p.terminal {
		fmt.Fprint(p.w, "\r"+line)
	} else {
		fmt.Fprintln(p.w, line)
	}
}

// Finish ends the bar's line on a terminal, once the run is over.
func (p *Progress) Finish() {
	if p.drawn && p.terminal {
		fmt.Fprintln(p.w)
	}
}
