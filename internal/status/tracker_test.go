package status

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/pkg/sched"
)

// TestReadsDoNotHoldTheLoopsLock: a read of the window (the status page's,
// a scrape's, a retry-after estimate's) sums up without the lock
// Decided takes on the dispatcher's loop: Decided completes while a read
// of 12,000 tenants is between its snapshot and its sums. Before, the
// whole read ran under the lock (BenchmarkDecidedWhilePaging: Decided
// waited up to 641 ms behind a page of 50,000 tenants, 463 ms long).
func TestReadsDoNotHoldTheLoopsLock(t *testing.T) {
	tr, _ := fillTracker(12_000)
	decided := 0
	tr.readHook = func() {
		done := make(chan struct{})
		go func() {
			tr.Decided(&sched.Leave{Grant: &sched.Grant{}, Class: "c", Tenant: "during", Uncached: 7, Weight: 1})
			close(done)
		}()
		select {
		case <-done:
			decided++
		case <-time.After(10 * time.Second):
			t.Fatal("Decided blocked while a read was summing up")
		}
	}
	w := tr.Class("c")
	if decided != 1 || w.Dispatched != 12_000 {
		t.Errorf("decided during the read %d times, the read saw %d dispatched; want 1 and the 12000 before it", decided, w.Dispatched)
	}
	tr.readHook = nil
	if got := tr.Class("c").Dispatched; got != 12_001 {
		t.Errorf("the next read saw %d dispatched, want 12001", got)
	}
}

// TestWindow: the window holds the last minute including the current
// second, drops what is older, and a clock that steps back writes into
// the latest second rather than into one a reader may hold.
func TestWindow(t *testing.T) {
	now := time.Unix(2_000_000, 0)
	tr := newTracker(func() time.Time { return now })
	g := &sched.Grant{}
	leave := func(tenant string, tokens uint64, queued bool) *sched.Leave {
		return &sched.Leave{Grant: g, Class: "c", Tenant: tenant, Uncached: tokens, Weight: 1, Queued: queued}
	}
	tr.Decided(leave("a", 100, true))
	now = now.Add(30 * time.Second)
	tr.Decided(leave("b", 50, true))
	tr.Decided(&sched.Leave{Class: "c"}) // refused
	w := tr.Class("c")
	want := []TenantTokens{{"a", 100}, {"b", 50}}
	if w.Dispatched != 2 || w.Rejected != 1 || !slices.Equal(w.Served, want) || w.Backlogged != 2 {
		t.Errorf("after 30s: %+v, want 2 dispatched, 1 refused, served %v over 2 backlogged", w, want)
	}
	now = now.Add(-20 * time.Second) // the clock steps back
	tr.Decided(leave("a", 1, false))
	now = now.Add(50 * time.Second) // 60 s after a's first grant: it left the window
	w = tr.Class("c")
	want = []TenantTokens{{"b", 50}, {"a", 1}}
	if w.Dispatched != 2 || !slices.Equal(w.Served, want) || w.Backlogged != 1 || !math.IsNaN(w.Jain) {
		t.Errorf("a minute on: %+v, want 2 dispatched (the step-back counted with b's second), served %v, 1 backlogged", w, want)
	}
	if got := tr.Class("none"); got.Dispatched != 0 || !math.IsNaN(got.Jain) {
		t.Errorf("a class without decisions: %+v", got)
	}
}
