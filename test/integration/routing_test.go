package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

// busyPolicy is one explicit fcfs class that queues once an endpoint has
// more than 100 prompt tokens in prefill, with a small per-worker request
// limit so the 429 path is reachable.
const busyPolicy = `
policy_classes:
  - name: standard
    queue_policy: fcfs
    quantum: 1
    prefill_busy_threshold: 100
    request_queue_limit_per_worker: 8
`

// TestPickReadyEndpoint: a request for an idle pool is routed at once; the
// header and the envoy.lb metadata carry the same endpoint list, the route
// cache is cleared, and the picked endpoint really serves the body.
func TestPickReadyEndpoint(t *testing.T) {
	launch.CheckGoroutines(t)
	bs := startBackends(t, 2)
	p := startEPP(t, launch.EPPOptions{Endpoints: addrs(bs), Args: []string{"--max-fallbacks=1"}})
	c := p.Client(t, extprocclient.Options{})

	body := tokens(64, 1)
	ex := mustStart(t, c, spec(body))
	d := ex.Decision()
	pick := mustRoute(t, ex)
	if !slices.Contains(addrs(bs), pick) {
		t.Fatalf("pick %q is not a configured endpoint %v", pick, addrs(bs))
	}
	if !slices.Equal(d.Endpoints, d.MetadataEndpoints) {
		t.Errorf("header endpoints %v != envoy.lb metadata endpoints %v", d.Endpoints, d.MetadataEndpoints)
	}
	if len(d.Endpoints) != 2 || d.Endpoints[0] == d.Endpoints[1] {
		t.Fatalf("endpoints %v: want the pick and the other endpoint as fallback", d.Endpoints)
	}
	if !d.ClearRouteCache {
		t.Error("clear_route_cache is false")
	}
	if string(d.Body) != string(body) {
		t.Errorf("body streamed back differs: %d bytes, want %d", len(d.Body), len(body))
	}

	status, out := forward(t, ex, "/v1/completions", http.Header{"content-type": {"application/json"}}, 16<<10)
	if status != http.StatusOK {
		t.Fatalf("upstream status %d", status)
	}
	var reply backendReply
	if err := json.Unmarshal(out, &reply); err != nil {
		t.Fatalf("upstream reply %q: %v", out, err)
	}
	if reply.ServedBy != pick || reply.Bytes != len(body) {
		t.Errorf("served by %s with %d bytes, want %s with %d", reply.ServedBy, reply.Bytes, pick, len(body))
	}
	var served *backend
	for _, b := range bs {
		if b.addr == pick {
			served = b
		}
	}
	if got := served.requests(); len(got) != 1 || got[0].destination != d.Endpoints[0]+","+d.Endpoints[1] {
		t.Errorf("backend saw %+v, want one request carrying x-gateway-destination-endpoint %v", got, d.Endpoints)
	}
	// The stream ended: the endpoint's accounting is released.
	p.Metrics.Await(t, 0, "laneway_endpoint_in_flight_requests", "endpoint", pick)
}

// TestNoEndpoint503 covers SPEC §7's 503 answers: no endpoints at all, an
// empty subset hint, and a hint naming no known endpoint; and that a subset
// hint is honoured in its list and comma string forms.
func TestNoEndpoint503(t *testing.T) {
	launch.CheckGoroutines(t)
	t.Run("pool without endpoints", func(t *testing.T) {
		p := startEPP(t, launch.EPPOptions{})
		c := p.Client(t, extprocclient.Options{})
		ir := immediate(t, mustStart(t, c, spec(tokens(10, 1))), http.StatusServiceUnavailable, "no_endpoints")
		var body struct {
			Error string `json:"error"`
		}
		if err := json.Unmarshal(ir.Body, &body); err != nil || body.Error == "" {
			t.Errorf("503 body %q: want JSON with an error message (%v)", ir.Body, err)
		}
	})

	bs := startBackends(t, 3)
	p := startEPP(t, launch.EPPOptions{Endpoints: addrs(bs), Args: []string{"--max-fallbacks=2"}})
	c := p.Client(t, extprocclient.Options{})
	a, b, cc := bs[0].addr, bs[1].addr, bs[2].addr

	cases := []struct {
		name   string
		subset extprocclient.SubsetHint
		want   []string // allowed picks; nil = 503
	}{
		{"empty list", extprocclient.SubsetHint{Endpoints: []string{}}, nil},
		{"empty string", extprocclient.SubsetHint{AsString: true}, nil},
		{"unknown endpoint", extprocclient.SubsetHint{Endpoints: []string{"127.0.0.99:1"}}, nil},
		{"one entry list", extprocclient.SubsetHint{Endpoints: []string{b}}, []string{b}},
		{"two entry list", extprocclient.SubsetHint{Endpoints: []string{b, cc}}, []string{b, cc}},
		{"comma string", extprocclient.SubsetHint{Endpoints: []string{cc, a}, AsString: true}, []string{cc, a}},
		{"ip without port", extprocclient.SubsetHint{Endpoints: []string{"127.0.0.3"}}, []string{b}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Several requests: a subset must hold for every pick, not by luck.
			for i := 0; i < 6; i++ {
				s := spec(tokens(10, i))
				s.Subset = &tc.subset
				ex := mustStart(t, c, s)
				if tc.want == nil {
					immediate(t, ex, http.StatusServiceUnavailable, "no_endpoints")
					continue
				}
				d := ex.Decision()
				mustRoute(t, ex)
				for _, e := range d.Endpoints {
					if !slices.Contains(tc.want, e) {
						t.Fatalf("endpoints %v include %s outside the subset %v", d.Endpoints, e, tc.want)
					}
				}
				if len(d.Endpoints) != len(tc.want) {
					t.Errorf("endpoints %v: want every subset member (%d)", d.Endpoints, len(tc.want))
				}
				completeStream(t, ex)
			}
		})
	}
}

// TestPinnedLaneDoesNotBlockOthers: a one-entry subset queues in its
// endpoint's exact lane while that endpoint is busy, and neither blocks a
// shared request (which goes to the idle endpoint at once) nor loses its
// place (it goes as soon as its endpoint's prefill finishes).
func TestPinnedLaneDoesNotBlockOthers(t *testing.T) {
	launch.CheckGoroutines(t)
	bs := startBackends(t, 2)
	a, b := bs[0].addr, bs[1].addr
	p := startEPP(t, launch.EPPOptions{Endpoints: addrs(bs), Policy: writePolicy(t, busyPolicy)})
	c := p.Client(t, extprocclient.Options{})

	big := mustStart(t, c, pinned(spec(tokens(500, 1)), a))
	if got := mustRoute(t, big); got != a {
		t.Fatalf("pinned big request went to %s, want %s", got, a)
	}
	p.Metrics.Await(t, 500, "laneway_endpoint_active_prefill_tokens", "endpoint", a)

	ctx := testCtx(t)
	waitA := startAsync(ctx, c, "pinned to A", pinned(spec(tokens(20, 2)), a))
	p.Metrics.Await(t, 1, "dynamo_frontend_router_queue_pending_requests", "policy_class", "standard")

	shared := mustStart(t, c, spec(tokens(20, 3)))
	if got := mustRoute(t, shared); got != b {
		t.Fatalf("shared request went to %s, want the idle %s", got, b)
	}
	// The shared dispatch did not take the pinned request with it.
	if n := p.Metrics.Value(t, "dynamo_frontend_router_queue_pending_requests", "policy_class", "standard"); n != 1 {
		t.Fatalf("pending after the shared dispatch = %v, want the pinned request still queued", n)
	}
	select {
	case s := <-waitA:
		t.Fatalf("pinned request answered while its endpoint is busy: %+v", s)
	default:
	}
	completeStream(t, shared)

	sendFirstByte(t, big)
	got := await(t, waitA)
	defer got.ex.Close()
	if pick := mustRoute(t, got.ex); pick != a {
		t.Fatalf("pinned request went to %s, want %s", pick, a)
	}
	if d := got.ex.Decision(); len(d.Endpoints) != 1 {
		t.Errorf("pinned pick %v carries fallbacks outside its one-entry subset", d.Endpoints)
	}
	finishStream(t, big)
	completeStream(t, got.ex)
	p.Metrics.Await(t, 0, "laneway_endpoint_in_flight_requests")
}

// TestQueueLimit429: once a class holds request_queue_limit_per_worker ×
// endpoints queued requests, the next one is answered 429 with the JSON
// details of SPEC §5 and the x-laneway-reason header.
func TestQueueLimit429(t *testing.T) {
	launch.CheckGoroutines(t)
	bs := startBackends(t, 1)
	p := startEPP(t, launch.EPPOptions{Endpoints: addrs(bs), Policy: writePolicy(t, busyPolicy)})
	c := p.Client(t, extprocclient.Options{})

	big := mustStart(t, c, spec(tokens(500, 1)))
	mustRoute(t, big)
	ctx := testCtx(t)
	released := make(chan started, 8)
	for i := 0; i < 8; i++ {
		startInto(ctx, c, "queued", spec(tokens(20, 10+i)), released)
		p.Metrics.Await(t, float64(i+1), "dynamo_frontend_router_queue_pending_requests", "policy_class", "standard")
	}

	over := mustStart(t, c, spec(tokens(20, 99)))
	ir := immediate(t, over, http.StatusTooManyRequests, "queue_limit")
	var body struct {
		Error   string `json:"error"`
		Details struct {
			PolicyClass string  `json:"policy_class"`
			LimitKind   string  `json:"limit_kind"`
			Current     float64 `json:"current"`
			Limit       float64 `json:"limit"`
		} `json:"details"`
	}
	if err := json.Unmarshal(ir.Body, &body); err != nil {
		t.Fatalf("429 body %q: %v", ir.Body, err)
	}
	if body.Error == "" || body.Details.PolicyClass != "standard" || body.Details.LimitKind != "requests" ||
		body.Details.Current != 8 || body.Details.Limit != 8 {
		t.Errorf("429 body %s: want error text and details {standard requests 8 8}", ir.Body)
	}
	if ct := ir.Headers.Get("content-type"); ct != "application/json" {
		t.Errorf("429 content-type %q", ct)
	}
	if n := p.Metrics.Value(t, "dynamo_frontend_router_queue_backpressure_total", "policy_class", "standard", "reason", "queue_limit_requests"); n != 1 {
		t.Errorf("backpressure counter = %v, want 1", n)
	}

	// Everything queued is still served, one by one, as prefill finishes.
	holder := big
	for i := 0; i < 8; i++ {
		sendFirstByte(t, holder)
		finishStream(t, holder)
		next := await(t, released)
		mustRoute(t, next.ex)
		holder = next.ex
	}
	completeStream(t, holder)
	p.Metrics.Await(t, 0, "laneway_endpoint_in_flight_requests")
}

// TestQueuedReleasedAtFirstByte: a request queued behind a busy endpoint is
// dispatched when that endpoint's first response body byte passes — not at
// the response headers, and without waiting for the stream to end.
func TestQueuedReleasedAtFirstByte(t *testing.T) {
	launch.CheckGoroutines(t)
	bs := startBackends(t, 1)
	a := bs[0].addr
	p := startEPP(t, launch.EPPOptions{Endpoints: addrs(bs), Policy: writePolicy(t, busyPolicy)})
	c := p.Client(t, extprocclient.Options{})

	big := mustStart(t, c, spec(tokens(500, 1)))
	mustRoute(t, big)
	ctx := testCtx(t)
	queued := startAsync(ctx, c, "queued", spec(tokens(50, 2)))
	p.Metrics.Await(t, 1, "dynamo_frontend_router_queue_pending_requests", "policy_class", "standard")

	var events []string
	if _, err := big.SendResponseHeaders(http.StatusOK, http.Header{"content-type": {"text/event-stream"}}, false, a); err != nil {
		t.Fatal(err)
	}
	events = append(events, "headers")
	// The headers were answered, so the picker has seen them; a scrape is
	// served by the same loop after any release they caused.
	if n := p.Metrics.Value(t, "dynamo_frontend_router_queue_pending_requests", "policy_class", "standard"); n != 1 {
		t.Fatalf("response headers released the queued request (pending %v)", n)
	}
	if ap := p.Metrics.Value(t, "laneway_endpoint_active_prefill_tokens", "endpoint", a); ap != 500 {
		t.Fatalf("active prefill after headers = %v, want 500", ap)
	}
	if _, err := big.SendResponseBody([]byte("data: {\"choices\":[]}\n\n"), false); err != nil {
		t.Fatal(err)
	}
	events = append(events, "first byte")
	s := await(t, queued)
	defer s.ex.Close()
	mustRoute(t, s.ex)
	events = append(events, "queued dispatched")
	finishStream(t, big)
	events = append(events, "busy stream ended")
	if want := []string{"headers", "first byte", "queued dispatched", "busy stream ended"}; !slices.Equal(events, want) {
		t.Errorf("events %v, want %v", events, want)
	}
	if ap := p.Metrics.Value(t, "laneway_endpoint_active_prefill_tokens", "endpoint", a); ap != 50 {
		t.Errorf("active prefill = %v, want only the released request's 50", ap)
	}
	completeStream(t, s.ex)
	p.Metrics.Await(t, 0, "laneway_endpoint_active_prefill_tokens", "endpoint", a)
}

// TestCancelWhileQueued: a client that goes away while queued leaves the
// queue at once and is never dispatched; the endpoint's accounting is
// unchanged and the next request is served normally.
func TestCancelWhileQueued(t *testing.T) {
	launch.CheckGoroutines(t)
	bs := startBackends(t, 1)
	a := bs[0].addr
	p := startEPP(t, launch.EPPOptions{Endpoints: addrs(bs), Policy: writePolicy(t, busyPolicy)})
	c := p.Client(t, extprocclient.Options{})

	big := mustStart(t, c, spec(tokens(500, 1)))
	mustRoute(t, big)
	ctx, cancel := context.WithCancel(context.Background())
	gone := startAsync(ctx, c, "goes away", spec(tokens(50, 2)))
	p.Metrics.Await(t, 1, "dynamo_frontend_router_queue_pending_requests", "policy_class", "standard")
	if n := p.Metrics.Value(t, "laneway_endpoint_in_flight_requests", "endpoint", a); n != 1 {
		t.Fatalf("in flight before cancel = %v, want 1", n)
	}

	cancel()
	if s := <-gone; s.err == nil {
		s.ex.Close()
		t.Fatal("cancelled request got an answer")
	}
	p.Metrics.Await(t, 0, "dynamo_frontend_router_queue_pending_requests", "policy_class", "standard")
	p.Metrics.Await(t, 1, "laneway_rejections_total", "policy_class", "standard", "reason", "cancelled")
	m := p.Metrics.Read(t)
	if n, _ := m.Sum("laneway_endpoint_in_flight_requests", "endpoint", a); n != 1 {
		t.Errorf("in flight after cancel = %v, want only the busy request", n)
	}
	if n, _ := m.Sum("laneway_endpoint_active_prefill_tokens", "endpoint", a); n != 500 {
		t.Errorf("active prefill after cancel = %v, want 500", n)
	}

	// Releasing the endpoint dispatches nothing: the queue is empty.
	completeStream(t, big)
	p.Metrics.Await(t, 0, "laneway_endpoint_in_flight_requests", "endpoint", a)
	m = p.Metrics.Read(t)
	if n, _ := m.Sum("laneway_dispatches_total", "queued", "true"); n != 0 {
		t.Errorf("queued dispatches = %v, want 0: the cancelled request was dispatched", n)
	}
	if n, _ := m.Sum("laneway_endpoint_active_prefill_tokens", "endpoint", a); n != 0 {
		t.Errorf("active prefill = %v, want 0", n)
	}

	next := mustStart(t, c, spec(tokens(50, 3)))
	if got := mustRoute(t, next); got != a {
		t.Fatalf("next request went to %s", got)
	}
	completeStream(t, next)
	p.Metrics.Await(t, 0, "laneway_endpoint_in_flight_requests", "endpoint", a)
}

// TestResetAfterPickReleases: a gateway that resets a routed stream before
// any response (client gone, upstream failure) releases the endpoint's
// accounting, and the request queued behind it is dispatched.
func TestResetAfterPickReleases(t *testing.T) {
	launch.CheckGoroutines(t)
	bs := startBackends(t, 1)
	a := bs[0].addr
	p := startEPP(t, launch.EPPOptions{Endpoints: addrs(bs), Policy: writePolicy(t, busyPolicy)})
	c := p.Client(t, extprocclient.Options{})

	big := mustStart(t, c, spec(tokens(500, 1)))
	mustRoute(t, big)
	queued := startAsync(testCtx(t), c, "queued", spec(tokens(50, 2)))
	p.Metrics.Await(t, 1, "dynamo_frontend_router_queue_pending_requests", "policy_class", "standard")

	if err := big.Close(); err != nil { // no response yet: the stream is reset
		t.Fatal(err)
	}
	s := await(t, queued)
	defer s.ex.Close()
	mustRoute(t, s.ex)
	m := p.Metrics.Read(t)
	if n, _ := m.Sum("laneway_endpoint_in_flight_requests", "endpoint", a); n != 1 {
		t.Errorf("in flight = %v, want only the released request", n)
	}
	if n, _ := m.Sum("laneway_endpoint_active_prefill_tokens", "endpoint", a); n != 50 {
		t.Errorf("active prefill = %v, want the released request's 50", n)
	}
	completeStream(t, s.ex)
	p.Metrics.Await(t, 0, "laneway_endpoint_in_flight_requests", "endpoint", a)
	p.Metrics.Await(t, 0, "laneway_endpoint_active_prefill_tokens", "endpoint", a)
}

// TestMalformedBody400: a body the picker cannot read is answered 400
// with reason malformed_body, and nothing is charged.
func TestMalformedBody400(t *testing.T) {
	launch.CheckGoroutines(t)
	bs := startBackends(t, 1)
	p := startEPP(t, launch.EPPOptions{Endpoints: addrs(bs)})
	c := p.Client(t, extprocclient.Options{})
	cases := []struct {
		name string
		body string
	}{
		{"not JSON", `{"model": "m", "prompt": [1, 2`},
		{"no prompt", `{"model": "m", "max_tokens": 1}`},
		{"prompt and messages", `{"model": "m", "prompt": "a", "messages": [{"role": "user", "content": "b"}]}`},
		{"negative token id", `{"model": "m", "prompt": [1, -2]}`},
		{"priority out of range", `{"model": "m", "prompt": [1], "nvext": {"agent_hints": {"priority": 3000000000}}}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ir := immediate(t, mustStart(t, c, spec([]byte(tc.body))), http.StatusBadRequest, "malformed_body")
			var body struct {
				Error string `json:"error"`
			}
			if err := json.Unmarshal(ir.Body, &body); err != nil || body.Error == "" {
				t.Errorf("400 body %q: want JSON with an error message (%v)", ir.Body, err)
			}
			if strings.Contains(string(ir.Body), tc.body) {
				t.Errorf("400 body quotes the request body: %s", ir.Body)
			}
		})
	}
	if n := p.Metrics.Value(t, "laneway_endpoint_in_flight_requests"); n != 0 {
		t.Errorf("in flight after 400s = %v", n)
	}
}
