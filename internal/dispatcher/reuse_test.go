package dispatcher

import (
	"context"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/pkg/sched"
)

// TestAllowListSurvivesEndpointIDReuse: a queued request whose subset hint
// names two endpoints must never be granted to a third one, even when that
// third endpoint arrives after one of the two left and takes over its
// internal id (SPEC §5: the subset hint restricts the candidates).
func TestAllowListSurvivesEndpointIDReuse(t *testing.T) {
	const a, b, c, newcomer = "127.0.0.2:8000", "127.0.0.3:8000", "127.0.0.4:8000", "127.0.0.9:8000"
	d := startDispatcher(t, oneClass(1000), a, b, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Make b and c busy so the allow-listed request queues on the shared heap.
	gb := mustAcquire(t, d, &sched.Ticket{RawISL: 1500, Allow: []string{b}, HasAllow: true})
	gc := mustAcquire(t, d, &sched.Ticket{RawISL: 1500, Allow: []string{c}, HasAllow: true})
	defer gb.Done()
	defer gc.Done()
	ch := acquireAsync(ctx, d, &sched.Ticket{RawISL: 10, Allow: []string{b, c}, HasAllow: true})
	waitQueued(t, d, 1)

	d.SetEndpoints(eps(a, b))           // c leaves; its id is free
	d.SetEndpoints(eps(a, b, newcomer)) // the newcomer takes c's id, idle
	// Snapshot is answered after both endpoint sets were applied.
	if s, _ := d.Snapshot(); s.Queued != 1 {
		r := <-ch
		if r.err == nil {
			t.Fatalf("allow-listed request [%s %s] granted %v after endpoint id reuse", b, c, r.g.Endpoints)
		}
		t.Fatalf("allow-listed request answered %v; want it still queued behind busy %s", r.err, b)
	}
	gb.FirstByte() // b frees up: the request must go there
	r := <-ch
	if r.err != nil || r.g.Endpoints[0] != b {
		t.Fatalf("after b freed: %v %v, want a grant on %s", r.g, r.err, b)
	}
	r.g.Done()
}
