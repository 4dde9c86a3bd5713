package simulate

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// progress is the bar on stderr. It draws only on a terminal, and only
// once a run has taken a second: a short run, and output into a file or a
// pipe (CI logs), stay clean.
type progress struct {
	w       io.Writer
	label   string
	start   time.Time
	drawn   bool
	enabled bool
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

func newProgress(w io.Writer, label string) *progress {
	return &progress{w: w, label: label, start: time.Now(), enabled: w != nil && isTerminal(w)}
}

func (p *progress) update(done, total int) {
	if !p.enabled || total == 0 || time.Since(p.start) < time.Second {
		return
	}
	const width = 40
	fill := done * width / total
	fmt.Fprintf(p.w, "\r  %-14s [%s%s] %3d%% %d/%d requests, %.0fs", p.label,
		strings.Repeat("#", fill), strings.Repeat(".", width-fill), done*100/total, done, total, time.Since(p.start).Seconds())
	p.drawn = true
}

func (p *progress) finish() {
	if p.drawn {
		fmt.Fprintln(p.w)
	}
}
