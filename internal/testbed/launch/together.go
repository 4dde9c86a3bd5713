package launch

import (
	"context"
	"fmt"
	"net/http"

	"github.com/laneway-dev/laneway/internal/testbed/workload"
)

// RunTogether runs the workload spec through the picker p in front of
// sims and releases it together. The simulators hold the first requests
// the picker sends them (POST /debug/hold), so their prefill does not
// finish and the picker queues every other request; once its metrics show
// all of them (queued, or sent since the start), the simulators let them
// go. The order the picker then serves them in is what a share test
// measures, not which client goroutine reached the gateway first: on a
// busy machine the requests otherwise reach the picker over a second or
// more, and it rightly serves each as it comes while its lanes are short.
//
// A held request has not reached its engine, which shows nothing: a
// picker behind a header-only gateway counts its grants against that
// empty engine (SPEC §5) and sends more than it would. Tests that bound
// the engine's queue behind such a gateway run unheld.
func RunTogether(ctx context.Context, t TB, p *EPP, sims []*Sim, spec workload.Spec) (*workload.Result, error) {
	t.Helper()
	total := spec.PerClass * len(spec.Classes)
	for _, g := range spec.Mix {
		total += g.Count
	}
	// The dispatch counter runs on across workloads: count from here.
	sent0, _ := p.Metrics.Read(t).Sum("laneway_dispatches_total")
	for _, s := range sims {
		s.Post(t, "/debug/hold")
	}
	type ran struct {
		res *workload.Result
		err error
	}
	done := make(chan ran, 1)
	go func() {
		res, err := workload.Run(ctx, spec)
		done <- ran{res, err}
	}()
	var in float64
	WaitFor(t, func() string { return fmt.Sprintf("all %d requests at the picker (queued or sent): %v", total, in) }, func() bool {
		m := p.Metrics.Read(t)
		queued, _ := m.Sum("dynamo_frontend_router_queue_pending_requests")
		sent, _ := m.Sum("laneway_dispatches_total")
		in = queued + sent - sent0
		return in >= float64(total)
	})
	for _, s := range sims {
		s.Post(t, "/debug/release")
	}
	r := <-done
	return r.res, r.err
}

// Post posts an empty body to one of the simulator's test endpoints
// (/debug/hold, /debug/release) and fails the test unless it answers 204.
func (s *Sim) Post(t TB, path string) {
	t.Helper()
	c := &http.Client{Timeout: EventTimeout}
	resp, err := c.Post(s.URL+path, "", nil)
	if err != nil {
		t.Fatalf("POST %s%s: %v", s.URL, path, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("POST %s%s: %s", s.URL, path, resp.Status)
	}
}
