package status

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/pkg/sched"
)

// fillTracker records tenants distinct tenants' grants in class c, spread
// over the window's seconds, on a clock it returns (at the window's end).
func fillTracker(tenants int) (*Tracker, *time.Time) {
	now := time.Unix(1_000_000, 0)
	tr := newTracker(func() time.Time { return now })
	g := &sched.Grant{}
	per := tenants / windowSecs
	for s := range windowSecs {
		for i := range per {
			tr.Decided(&sched.Leave{Grant: g, Class: "c", Tenant: fmt.Sprintf("t%06d", s*per+i), Uncached: 100, Weight: 1, Queued: true, Wait: time.Millisecond})
		}
		now = now.Add(time.Second)
	}
	now = now.Add(-time.Second)
	return tr, &now
}

// BenchmarkDecidedWhilePaging: the dispatcher loop's Decided while the
// status page reads a minute of 50,000 tenants: max-decided-wait-ms is
// the longest one Decided took (waiting for the tracker's lock, or for a
// core on a busy machine), page-ms what one read of the class took, and
// lock-ms how long a read holds the lock (its snapshot).
func BenchmarkDecidedWhilePaging(b *testing.B) {
	tr, _ := fillTracker(50_000)
	g := &sched.Grant{}
	var maxWait, pageTime, lockTime time.Duration
	for b.Loop() {
		var wg sync.WaitGroup
		wg.Add(1)
		start := time.Now()
		go func() { defer wg.Done(); _ = tr.Class("c") }()
		for time.Since(start) < 200*time.Millisecond {
			t0 := time.Now()
			tr.Decided(&sched.Leave{Grant: g, Class: "c", Tenant: "loop", Uncached: 1, Weight: 1})
			maxWait = max(maxWait, time.Since(t0))
		}
		wg.Wait()
		t0 := time.Now()
		_ = tr.Class("c")
		pageTime = max(pageTime, time.Since(t0))
		t0 = time.Now()
		_, _ = tr.snapshot("c")
		lockTime = max(lockTime, time.Since(t0))
	}
	b.ReportMetric(float64(maxWait.Microseconds())/1000, "max-decided-wait-ms")
	b.ReportMetric(float64(pageTime.Microseconds())/1000, "page-ms")
	b.ReportMetric(float64(lockTime.Microseconds())/1000, "lock-ms")
}
