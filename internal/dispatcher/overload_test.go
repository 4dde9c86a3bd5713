package dispatcher

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/laneway-dev/laneway/pkg/podmetrics"
	"github.com/laneway-dev/laneway/pkg/sched"
)

// waitingPage is a scrape result with an engine queue of n requests.
func waitingPage(n int) podmetrics.Metrics {
	return podmetrics.Metrics{Known: podmetrics.Waiting | podmetrics.Running, Waiting: n}
}

// TestOverloadFilter: an endpoint whose engine queue is past the bound is
// skipped; when that leaves nothing, queued and new requests get a 503
// naming the filter at once instead of waiting; a scrape within the bound
// brings the endpoint back.
func TestOverloadFilter(t *testing.T) {
	const a, b = "127.0.0.2:8000", "127.0.0.3:8000"
	// The threshold is high enough that the waiting requests, counted as
	// unseen prefill, do not make an endpoint busy by themselves.
	d := startWith(t, oneClass(100_000), Options{Options: sched.Options{MaxEngineQueue: 5}}, sched.Endpoint{Addr: a}, sched.Endpoint{Addr: b})
	ctx := context.Background()

	d.SetEndpointMetrics(a, waitingPage(6), false)
	d.SetEndpointMetrics(b, waitingPage(5), false) // at the bound is not past it
	for i := 0; i < 3; i++ {
		g, err := d.Acquire(ctx, &sched.Ticket{RawISL: 10})
		if err != nil {
			t.Fatal(err)
		}
		if g.Endpoints[0] != b {
			t.Fatalf("pick %d went to %s, want %s (a is past the bound)", i, g.Endpoints[0], b)
		}
		g.Done()
	}

	// b busy: a request queues behind it.
	busy, err := d.Acquire(ctx, &sched.Ticket{RawISL: 200_000})
	if err != nil {
		t.Fatal(err)
	}
	queued := acquireAsync(ctx, d, &sched.Ticket{RawISL: 10})
	waitQueued(t, d, 1)

	// Now b's queue is past the bound too: nothing is left, so the queued
	// request is answered at once, naming the filter.
	d.SetEndpointMetrics(b, waitingPage(9), false)
	r := <-queued
	var ne *sched.NoEndpointError
	if !errors.As(r.err, &ne) || !strings.Contains(ne.Filter, "--max-engine-queue=5") {
		t.Fatalf("queued request: got %+v, want a sched.NoEndpointError naming --max-engine-queue=5", r)
	}
	if _, err := d.Acquire(ctx, &sched.Ticket{RawISL: 10}); !errors.As(err, &ne) {
		t.Fatalf("new request: err = %v, want sched.NoEndpointError", err)
	}
	// A pinned request is filtered the same way.
	if _, err := d.Acquire(ctx, &sched.Ticket{RawISL: 10, HasAllow: true, Allow: []string{a}}); !errors.As(err, &ne) {
		t.Fatalf("pinned request: err = %v, want sched.NoEndpointError", err)
	}
	busy.Done()

	// a's queue drains: it takes requests again.
	d.SetEndpointMetrics(a, waitingPage(0), false)
	g, err := d.Acquire(ctx, &sched.Ticket{RawISL: 10})
	if err != nil || g.Endpoints[0] != a {
		t.Fatalf("after a drained: grant %+v, err %v; want a pick on %s", g, err, a)
	}
	g.Done()
}

// TestOverloadFilterOff: without a bound, a long engine queue only adds
// unseen load; it never filters.
func TestOverloadFilterOff(t *testing.T) {
	const a = "127.0.0.2:8000"
	d := startWith(t, oneClass(0), Options{}, sched.Endpoint{Addr: a})
	d.SetEndpointMetrics(a, waitingPage(1000), false)
	g, err := d.Acquire(context.Background(), &sched.Ticket{RawISL: 10})
	if err != nil || g.Endpoints[0] != a {
		t.Fatalf("grant %+v, err %v; want a pick on %s", g, err, a)
	}
	g.Done()
}
