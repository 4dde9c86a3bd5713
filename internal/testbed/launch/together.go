package launch

import (
	"context"
	"fmt"
	"net/http"

	"github.com/laneway-dev/laneway/internal/testbed/workload"
)

// RunTogether runs the workload spec through the pickers in front of sims
// and releases it together. The simulators hold the first requests the
// pickers send them (POST /debug/hold), so their prefill does not finish
// and the pickers queue every other request; once the pickers' metrics
// show all of them (queued, or sent since the start), the simulators let them go. The
// order the pickers then serve them in is what a share test measures, not
// which client goroutine reached a gateway first: on a busy machine the
// requests otherwise reach the pickers over a second or more, and a
// picker rightly serves each as it comes while its lanes are short.
func RunTogether(ctx context.Context, t TB, pickers []*EPP, sims []*Sim, spec workload.Spec) (*workload.Result, error) {
	t.Helper()
	total := spec.PerClass * len(spec.Classes)
	for _, g := range spec.Mix {
		total += g.Count
	}
	// A picker's dispatch counter runs on across workloads: count from
	// here.
	sent0 := 0.0
	for _, p := range pickers {
		n, _ := p.Metrics.Read(t).Sum("laneway_dispatches_total")
		sent0 += n
	}
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
	WaitFor(t, func() string { return fmt.Sprintf("all %d requests at the pickers (queued or sent): %v", total, in) }, func() bool {
		in = -sent0
		for _, p := range pickers {
			m := p.Metrics.Read(t)
			queued, _ := m.Sum("dynamo_frontend_router_queue_pending_requests")
			sent, _ := m.Sum("laneway_dispatches_total")
			in += queued + sent
		}
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
