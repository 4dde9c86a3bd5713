package sched

import (
	"testing"

	"github.com/laneway-dev/laneway/pkg/policy"
)

// autoCore is a core with one endpoint (step budget 8192) and one class
// with an auto threshold, fresh after a first scrape at time 0.
func autoCore(t *testing.T) *Core {
	t.Helper()
	p := byHeader(0, class("standard", 512, 0))
	p.Classes[0].Queueing = true
	p.Busy[0] = policy.BusyTest{Auto: true}
	c := newCore(t, p, Options{ExpectMetrics: true}, ep1)
	scrape(c, 0, 0, 0, 0)
	return c
}

// The auto threshold starts at 7/8 of the step budget, the busy test reads it,
// the engine's queue lowers it, the snapshot shows it, and an engine
// restart (its counter going back) starts it over.
func TestAutoThreshold(t *testing.T) {
	c := autoCore(t)
	if e := endpointState(c); !e.HasAuto || e.AutoThreshold != 7168 {
		t.Fatalf("start: %+v, want 7/8 of the step budget", e)
	}
	// 15 prompts of 512: the 15th takes the load past 7168.
	for i := 0; i < 15; i++ {
		grantNow(t, c, ms(1), 512)
	}
	admit(c, ms(2), &Ticket{RawISL: 512})
	if l := c.Drain(ms(2)); len(l) != 0 || c.Len() != 1 {
		t.Fatalf("over the threshold: %d decisions, %d queued; want the request held", len(l), c.Len())
	}
	// The engine keeps 12 of them waiting at every scrape of a window
	// (the first window, opened at the scrape of time 0, saw none): the
	// threshold falls to about its intake plus one prompt.
	for i := int64(1); i <= 12; i++ {
		scrape(c, ms(100*i), 12, 5, 0)
	}
	if e := endpointState(c); e.AutoThreshold >= 7168 || e.AutoThreshold < 512 || !e.Busy {
		t.Fatalf("after a window of 12 waiting: %+v, want the threshold lowered to [512, 7168) and the endpoint busy", e)
	}
	// The engine restarted: its counter went back.
	scrape(c, ms(1300), 0, 0, 100)
	scrape(c, ms(1400), 0, 0, 0)
	if e := endpointState(c); e.AutoThreshold != 7168 {
		t.Fatalf("after a restart: threshold %d, want the start again", e.AutoThreshold)
	}
}

// A fixed threshold leaves the auto controller out of the snapshot.
func TestFixedThresholdHasNoAuto(t *testing.T) {
	c := ledgerCore(t)
	if e := endpointState(c); e.HasAuto {
		t.Fatalf("%+v: a policy without auto classes shows an auto threshold", e)
	}
}
