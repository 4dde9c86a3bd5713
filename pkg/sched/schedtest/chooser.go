package schedtest

import (
	"slices"
	"sync"
	"testing"

	"github.com/laneway-dev/laneway/pkg/sched"
)

// Recorder is a sched.Chooser that lets Inner choose and keeps the
// candidates of every choice. It is safe for concurrent use: a driver's
// loop chooses while the test reads.
type Recorder struct {
	Inner sched.Chooser

	mu    sync.Mutex
	picks [][]sched.Candidate
}

var _ sched.Chooser = (*Recorder)(nil)

// Choose records the candidates and returns Inner's choice.
func (r *Recorder) Choose(t *sched.Ticket, cands []sched.Candidate, out []int) []int {
	r.mu.Lock()
	r.picks = append(r.picks, slices.Clone(cands))
	r.mu.Unlock()
	return r.Inner.Choose(t, cands, out)
}

// Last returns the candidates of the latest choice by address; it fails
// the test when there was none.
func (r *Recorder) Last(t testing.TB) map[string]sched.Candidate {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.picks) == 0 {
		t.Fatal("no pick recorded")
	}
	out := map[string]sched.Candidate{}
	for _, c := range r.picks[len(r.picks)-1] {
		out[c.Addr] = c
	}
	return out
}
