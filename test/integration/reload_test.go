package integration

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

// reloadedPolicy tightens standard's limit to 4 and adds a batch class.
const reloadedPolicy = `
default_policy_class: standard
policy_classes:
  - name: standard
    queue_policy: fcfs
    quantum: 1
    prefill_busy_threshold: 100
    request_queue_limit_per_worker: 4
  - name: batch
    queue_policy: fcfs
    quantum: 1
    prefill_busy_threshold: 100
    request_queue_limit_per_worker: 8
`

// renamedPolicy replaces every class with one new class.
const renamedPolicy = `
policy_classes:
  - name: gold
    queue_policy: fcfs
    quantum: 1
    prefill_busy_threshold: 100
    request_queue_limit_per_worker: 8
`

// invalidPolicy has an unknown key, which the strict loader rejects.
const invalidPolicy = `
policy_classes:
  - name: standard
    queue_policy: fcfs
    quantum: 1
    prefill_busy_threshold: 100
    request_queue_limit_per_worker: 1
    surprise: true
`

// TestPolicyReload changes the policy file while requests are queued: the
// new classes and limits apply, the queued requests keep their places and
// are all served, and a later invalid file is logged and ignored.
func TestPolicyReload(t *testing.T) {
	launch.CheckGoroutines(t)
	bs := startBackends(t, 1)
	path := writePolicy(t, busyPolicy)
	p := startEPP(t, launch.EPPOptions{Endpoints: addrs(bs), Policy: path, Args: []string{"--policy-poll-interval=20ms"}})
	c := p.Client(t, extprocclient.Options{})

	holder := mustStart(t, c, spec(tokens(500, 0)))
	mustRoute(t, holder)
	ctx := testCtx(t)
	released := make(chan started, 8)
	queued := 0
	enqueue := func(class string, wantPending float64) {
		t.Helper()
		var hs []string
		if class != "standard" {
			hs = []string{"x-laneway-policy-class", class}
		}
		startInto(ctx, c, class, spec(tokens(150, 100+queued), hs...), released)
		queued++
		p.Metrics.Await(t, wantPending, "dynamo_frontend_router_queue_pending_requests", "policy_class", class)
	}
	for i := 1; i <= 3; i++ {
		enqueue("standard", float64(i))
	}

	replaceFile(t, path, reloadedPolicy)
	launch.WaitFor(t, func() string { return "the batch class never appeared in the metrics" }, func() bool {
		_, found := p.Metrics.Read(t).Sum("dynamo_frontend_router_queue_pending_requests", "policy_class", "batch")
		return found
	})
	if n := p.Metrics.Value(t, "dynamo_frontend_router_queue_pending_requests", "policy_class", "standard"); n != 3 {
		t.Fatalf("standard pending after reload = %v, want the 3 queued before", n)
	}
	enqueue("standard", 4)
	enqueue("batch", 1)
	overLimit := func(wantLimit float64) {
		t.Helper()
		ir := immediate(t, mustStart(t, c, spec(tokens(150, 999))), http.StatusTooManyRequests, "queue_limit")
		var body struct {
			Details struct {
				PolicyClass string  `json:"policy_class"`
				Limit       float64 `json:"limit"`
			} `json:"details"`
		}
		if err := json.Unmarshal(ir.Body, &body); err != nil || body.Details.PolicyClass != "standard" || body.Details.Limit != wantLimit {
			t.Fatalf("429 body %s (%v): want standard's limit %v", ir.Body, err, wantLimit)
		}
	}
	overLimit(4)

	replaceFile(t, path, invalidPolicy)
	p.WaitLog(t, "policy file rejected") // the invalid policy file is reported
	overLimit(4)                         // not 1: the old policy stays in force
	m := p.Metrics.Read(t)
	if n, _ := m.Sum("dynamo_frontend_router_queue_pending_requests", "policy_class", "standard"); n != 4 {
		t.Errorf("standard pending = %v, want 4", n)
	}
	if n, found := m.Sum("dynamo_frontend_router_queue_pending_requests", "policy_class", "batch"); !found || n != 1 {
		t.Errorf("batch pending = %v (present %v), want 1", n, found)
	}

	// A policy whose classes all differ: every queued request is resolved
	// again into the new class, none is dropped.
	replaceFile(t, path, renamedPolicy)
	launch.WaitFor(t, func() string { return "the 5 queued requests never showed up in class gold" }, func() bool {
		return p.Metrics.Value(t, "dynamo_frontend_router_queue_pending_requests", "policy_class", "gold") == 5
	})
	if _, found := p.Metrics.Read(t).Sum("dynamo_frontend_router_queue_pending_requests", "policy_class", "standard"); found {
		t.Error("class standard is still exported after it was removed")
	}

	// Nothing was lost: every queued request is served.
	served := map[string]int{}
	for i := 0; i < queued; i++ {
		completeStream(t, holder)
		next := await(t, released)
		mustRoute(t, next.ex)
		served[next.name]++
		holder = next.ex
	}
	completeStream(t, holder)
	if served["standard"] != 4 || served["batch"] != 1 {
		t.Errorf("served %v, want 4 standard and 1 batch", served)
	}
	p.Metrics.Await(t, 0, "laneway_endpoint_in_flight_requests")
}
