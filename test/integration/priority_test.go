package integration

import (
	"slices"
	"testing"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

func i32(v int32) *int32   { return &v }
func u32(v uint32) *uint32 { return &v }

// TestPriorityOrder queues requests behind a busy endpoint in a known
// arrival order and releases them one at a time: strict priority tiers go
// first, then fcfs with the soft priority as a bump in seconds of earlier
// arrival; headers override the body; a negative priority never pushes a
// request back (SPEC §3, §6).
func TestPriorityOrder(t *testing.T) {
	launch.CheckGoroutines(t)
	bs := startBackends(t, 1)
	p := startEPP(t, launch.EPPOptions{Endpoints: addrs(bs), Policy: writePolicy(t, busyPolicy)})
	c := p.Client(t, extprocclient.Options{})

	holder := mustStart(t, c, spec(tokens(500, 0)))
	mustRoute(t, holder)

	// Each queued request costs 150 tokens, above the 100-token threshold,
	// so every first byte lets exactly one through.
	reqs := []struct {
		name    string
		hints   *agentHints
		headers []string
	}{
		{name: "plain"},
		{name: "body bump 60s", hints: &agentHints{Priority: i32(60)}},
		{name: "strict 1 by header", headers: []string{"x-dynamo-request-strict-priority", "1"}},
		{name: "laneway header bump 30s", headers: []string{"x-laneway-priority", "30"}},
		{name: "header 0 overrides body 100", hints: &agentHints{Priority: i32(100)}, headers: []string{"x-dynamo-request-priority", "0"}},
		{name: "strict 2 by body", hints: &agentHints{StrictPriority: u32(2), Priority: i32(-50)}},
		{name: "negative clamped", hints: &agentHints{Priority: i32(-1000)}},
		{name: "malformed header ignored", hints: &agentHints{Priority: i32(45)}, headers: []string{"x-dynamo-request-priority", "high"}},
	}
	ctx := testCtx(t)
	released := make(chan started, len(reqs))
	for i, r := range reqs {
		startInto(ctx, c, r.name, spec(tokensWith(150, i+1, r.hints), r.headers...), released)
		// Wait until it is queued so arrival order is the list order.
		p.Metrics.Await(t, float64(i+1), "dynamo_frontend_router_queue_pending_requests", "policy_class", "standard")
	}

	order, holder := releaseOneByOne(t, holder, released, len(reqs))
	completeStream(t, holder)
	want := []string{
		"strict 2 by body",
		"strict 1 by header",
		"body bump 60s",
		"malformed header ignored",
		"laneway header bump 30s",
		"plain",
		"header 0 overrides body 100",
		"negative clamped",
	}
	if !slices.Equal(order, want) {
		t.Errorf("release order:\n got %q\nwant %q", order, want)
	}
	p.Metrics.Await(t, 0, "laneway_endpoint_in_flight_requests")
}

// TestForwardedPriorityIsThePickers: with --forward-priority the picker
// owns the body's top-level priority. A body that sets it itself, with no
// hint, reaches the engine without it (vLLM serves lower values first: an
// anonymous -2147483648 would jump every queue in the engine); a hint
// reaches it capped by the tenant's binding and in the engine's polarity,
// as the one priority member.
func TestForwardedPriorityIsThePickers(t *testing.T) {
	launch.CheckGoroutines(t)
	bs := startBackends(t, 1)
	cases := []struct {
		name   string
		policy string // "" is the synthetic class without identity
		body   string
		want   string // the forwarded body
	}{
		{name: "identity, no hint: the client's priority goes", policy: "identity: {header: x-tenant-id}\n",
			body: `{"model":"m","prompt":[1,2],"priority":-2147483648}`, want: `{"model":"m","prompt":[1,2]}`},
		{name: "identity, no hint, priority first", policy: "identity: {header: x-tenant-id}\n",
			body: `{"priority":-2147483648,"model":"m","prompt":[1,2]}`, want: `{"model":"m","prompt":[1,2]}`},
		{name: "identity, a hint: capped to the binding's 0", policy: "identity: {header: x-tenant-id}\n",
			body: `{"priority":-99,"model":"m","prompt":[1,2],"nvext":{"agent_hints":{"priority":7}}}`,
			want: `{"priority":0,"model":"m","prompt":[1,2],"nvext":{"agent_hints":{"priority":7}}}`},
		{name: "no identity, no hint: the client's priority goes",
			body: `{"model":"m","prompt":[1,2],"priority":-5}`, want: `{"model":"m","prompt":[1,2]}`},
		{name: "no identity, a hint: negated for vLLM",
			body: `{"model":"m","priority":3,"prompt":[1,2],"nvext":{"agent_hints":{"priority":7}}}`,
			want: `{"model":"m","priority":-7,"prompt":[1,2],"nvext":{"agent_hints":{"priority":7}}}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := launch.EPPOptions{Endpoints: addrs(bs), Args: []string{"--forward-priority"}}
			if tc.policy != "" {
				o.Policy = writePolicy(t, tc.policy)
			}
			p := startEPP(t, o)
			ex := mustStart(t, p.Client(t, extprocclient.Options{}), spec([]byte(tc.body)))
			mustRoute(t, ex)
			if got := string(ex.Decision().Body); got != tc.want {
				t.Errorf("forwarded body %s, want %s", got, tc.want)
			}
			completeStream(t, ex)
		})
	}
}
