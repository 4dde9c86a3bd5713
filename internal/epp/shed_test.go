package epp

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/pkg/drr"
	"github.com/laneway-dev/laneway/pkg/extproc"
	"github.com/laneway-dev/laneway/pkg/policy"
	"github.com/laneway-dev/laneway/pkg/sched"
)

// TestShedAnswerOnAFakeClock follows a request shed for its wait budget
// from the scheduling core, driven on a fake clock, to the 429 the gateway
// sends: the body's numbers are the core's, exactly.
func TestShedAnswerOnAFakeClock(t *testing.T) {
	const sec = int64(time.Second)
	pol := &sched.Policy{
		Classes: []drr.ClassConfig{{Name: "batch", Quantum: 1, Queueing: true, WaitBudget: 1500 * time.Millisecond,
			RequestLimitPerWorker: drr.NoLimit, RawISLLimitPerWorker: drr.NoLimit, CachedLimitPerWorker: drr.NoLimit}},
		Busy:    []policy.BusyTest{{Threshold: 100, HasThreshold: true}},
		Resolve: func(*sched.Ticket) int { return 0 },
	}
	core, err := sched.New(pol, sched.Options{})
	if err != nil {
		t.Fatal(err)
	}
	core.SetEndpoints(0, []sched.Endpoint{{Addr: "127.0.0.2:8000"}})
	var hog, queued sched.Request
	hog.Reset(&sched.Ticket{RawISL: 500}, nil)
	core.Admit(0, &hog)
	queued.Reset(&sched.Ticket{RawISL: 10}, nil)
	core.Admit(sec/4, &queued)
	if l := core.Drain(sec / 4); len(l) != 1 || l[0].Req != &hog {
		t.Fatalf("decisions %d, want only the direct grant", len(l))
	}
	l := core.Drain(2 * sec) // waited 1.75 s of a 1.5 s budget
	if len(l) != 1 || l[0].Req != &queued {
		t.Fatalf("decisions %d at 2 s, want the queued request shed", len(l))
	}
	reply, ok := (&Handler{}).replyFor(l[0].Err).(*extproc.Reply)
	if !ok || reply.Status != http.StatusTooManyRequests || reply.Reason != "shed" {
		t.Fatalf("answer %#v, want a 429 shed reply", (&Handler{}).replyFor(l[0].Err))
	}
	var body struct {
		Error   string
		Details map[string]any
	}
	if err := json.Unmarshal(reply.Body, &body); err != nil {
		t.Fatalf("429 body %q: %v", reply.Body, err)
	}
	want := map[string]any{"policy_class": "batch", "waited_seconds": 1.75, "budget_seconds": 1.5}
	if len(body.Details) != len(want) {
		t.Fatalf("details %v, want %v", body.Details, want)
	}
	for k, v := range want {
		if body.Details[k] != v {
			t.Errorf("details[%s] = %v, want %v (body %s)", k, body.Details[k], v, reply.Body)
		}
	}
	if body.Error != `policy class "batch": queued 1.75s, past its wait budget of 1.5s` {
		t.Errorf("error %q", body.Error)
	}
}
