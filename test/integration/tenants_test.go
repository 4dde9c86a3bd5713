package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/laneway-dev/laneway/internal/status"
	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

// trustPolicy binds the tenant vip to premium and every other identity to
// regular; busy above 100 prefill tokens, so each 150-token request
// queued behind a busy endpoint is released alone. identity is the YAML
// of the identity source.
func trustPolicy(identity string) string {
	return identity + `
tenants:
  - name: vip
    match: {exact: [vip]}
    allowed: [premium]
    default_family: premium
default_tenant:
  allowed: [regular]
  default_family: regular
default_policy_family: regular
uncached_isl_buckets: [{min_tokens: 0, bucket: all}]
policy_classes:
  - {name: premium, policy_family: premium, cache_bucket: all, queue_policy: fcfs, quantum: 512, prefill_busy_threshold: 100}
  - {name: regular, policy_family: regular, cache_bucket: all, queue_policy: fcfs, quantum: 128, prefill_busy_threshold: 100}
`
}

// jwtClaims is the forwarded metadata a JWT filter writes for subject sub
// under provider "idp".
func jwtClaims(sub string) map[string]*structpb.Struct {
	claims, err := structpb.NewStruct(map[string]any{"idp": map[string]any{"sub": sub, "iss": "test"}})
	if err != nil {
		panic(err)
	}
	return map[string]*structpb.Struct{"envoy.filters.http.jwt_authn": claims}
}

// TestTenantCannotClaimPremium is the trust check of SPEC §14 through the
// real binary, with the identity from a gateway-set header and,
// separately, from forwarded JWT metadata: callers bound to regular that
// send x-laneway-policy-class: premium and x-laneway-strict-priority:
// 4294967295 are served in regular at tier 0, after the premium tenant's
// requests (which they would precede in premium) and in arrival order
// inside regular (which their tier would have changed).
func TestTenantCannotClaimPremium(t *testing.T) {
	cases := []struct {
		name     string
		identity string
		as       func(s extprocclient.RequestSpec, who string) extprocclient.RequestSpec
	}{
		{"header", "identity: {header: x-tenant-id}", func(s extprocclient.RequestSpec, who string) extprocclient.RequestSpec {
			s.Headers.Set("x-tenant-id", who)
			return s
		}},
		{"jwt metadata", "identity: {metadata: {namespace: envoy.filters.http.jwt_authn, path: [idp, sub]}}", func(s extprocclient.RequestSpec, who string) extprocclient.RequestSpec {
			s.Metadata = jwtClaims(who)
			// A client's own identity header means nothing here.
			s.Headers.Set("x-tenant-id", "vip")
			return s
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			launch.CheckGoroutines(t)
			p := startEPP(t, launch.EPPOptions{Endpoints: []string{"127.0.0.2:8000"}, Policy: writePolicy(t, trustPolicy(tc.identity))})
			if !strings.Contains(p.Log.String(), "tenants: identity from") {
				t.Errorf("startup log does not say where identity comes from:\n%s", p.Log.Tail(4096))
			}
			c := p.Client(t, extprocclient.Options{})
			holder := mustStart(t, c, tc.as(spec(tokens(500, 0)), "vip"))
			mustRoute(t, holder)

			ctx := testCtx(t)
			released := make(chan started, 8)
			claim := []string{"x-laneway-policy-class", "premium", "x-laneway-strict-priority", "4294967295"}
			queue := []struct{ name, who string }{
				{"eve", "eve"}, {"mallory 1", "mallory"}, {"mallory 2", "mallory"}, {"mallory 3", "mallory"},
				{"vip 1", "vip"}, {"vip 2", "vip"}, {"vip 3", "vip"}, {"vip 4", "vip"},
			}
			for i, q := range queue {
				var hs []string
				if strings.HasPrefix(q.name, "mallory") {
					hs = claim
				}
				startInto(ctx, c, q.name, tc.as(spec(tokens(150, i+1), hs...), q.who), released)
				p.Metrics.Await(t, float64(i+1), "dynamo_frontend_router_queue_pending_requests")
			}
			if got := p.Metrics.Value(t, "dynamo_frontend_router_queue_pending_requests", "policy_class", "regular"); got != 4 {
				t.Errorf("regular holds %v queued requests, want eve and mallory's 3", got)
			}
			order, holder := releaseOneByOne(t, holder, released, len(queue))
			completeStream(t, holder)
			want := []string{"vip 1", "vip 2", "vip 3", "vip 4", "eve", "mallory 1", "mallory 2", "mallory 3"}
			if !slices.Equal(order, want) {
				t.Errorf("release order:\n got %q\nwant %q", order, want)
			}
			for class, n := range map[string]float64{"premium": 4, "regular": 4} {
				if got := p.Metrics.Value(t, "laneway_dispatches_total", "policy_class", class, "queued", "true"); got != n {
					t.Errorf("queued dispatches in %s = %v, want %v", class, got, n)
				}
			}
		})
	}
}

// TestTenantLimits: a tenant's own queue limit and a class's tenant bound
// answer 429 whose details name the tenant and the limit.
func TestTenantLimits(t *testing.T) {
	launch.CheckGoroutines(t)
	p := startEPP(t, launch.EPPOptions{Endpoints: []string{"127.0.0.2:8000"}, Policy: writePolicy(t, `
tenants:
  - {name: small, match: {exact: [small]}, request_queue_limit: 2}
policy_classes:
  - {name: shared, quantum: 100, prefill_busy_threshold: 100, tenant_fairness: true, max_tenants: 2}
`)})
	c := p.Client(t, extprocclient.Options{})
	holder := mustStart(t, c, spec(tokens(500, 0)))
	mustRoute(t, holder)
	ctx := testCtx(t)
	queued := make(chan started, 8)
	as := func(who string, seed int) extprocclient.RequestSpec {
		return spec(tokens(150, seed), "x-laneway-tenant", who)
	}
	for i, who := range []string{"small", "small", "big"} {
		startInto(ctx, c, who, as(who, i+1), queued)
		p.Metrics.Await(t, float64(i+1), "dynamo_frontend_router_queue_pending_requests", "policy_class", "shared")
	}
	details := func(ir *extprocclient.ImmediateResponse) map[string]any {
		var b struct{ Details map[string]any }
		if err := json.Unmarshal(ir.Body, &b); err != nil {
			t.Fatalf("429 body %q: %v", ir.Body, err)
		}
		return b.Details
	}
	check := func(what string, got, want map[string]any) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: details %v, want %v", what, got, want)
		}
	}
	third := mustStart(t, c, as("small", 10))
	check("third request of small", details(immediate(t, third, 429, "queue_limit")),
		map[string]any{"policy_class": "shared", "tenant": "small", "limit_kind": "requests", "current": float64(2), "limit": float64(2)})
	newcomer := mustStart(t, c, as("carol", 11))
	check("a third tenant", details(immediate(t, newcomer, 429, "queue_limit")),
		map[string]any{"policy_class": "shared", "tenant": "carol", "limit_kind": "tenants", "current": float64(2), "limit": float64(2)})
	if got := p.Metrics.Value(t, "laneway_rejections_total", "reason", "tenant_limit_requests"); got != 1 {
		t.Errorf("tenant_limit_requests rejections = %v, want 1", got)
	}
	if got := p.Metrics.Value(t, "laneway_tenants_active", "policy_class", "shared"); got != 2 {
		t.Errorf("laneway_tenants_active = %v, want 2", got)
	}
	_, holder = releaseOneByOne(t, holder, queued, 3)
	completeStream(t, holder)
}

// TestLanewayStatus runs `laneway status --output json` against a running
// picker and checks its numbers: the tenants queued in a class with their
// requests and tokens, and what each was served in the last minute.
func TestLanewayStatus(t *testing.T) {
	launch.CheckGoroutines(t)
	p := startEPP(t, launch.EPPOptions{Endpoints: []string{"127.0.0.2:8000"}, Policy: writePolicy(t, `
policy_classes:
  - {name: shared, quantum: 100, prefill_busy_threshold: 100, tenant_fairness: true}
`)})
	c := p.Client(t, extprocclient.Options{})
	holder := mustStart(t, c, spec(tokens(500, 0), "x-laneway-tenant", "a"))
	mustRoute(t, holder)
	ctx := testCtx(t)
	queued := make(chan started, 8)
	for i, who := range []string{"a", "b", "a", "b", "a"} {
		startInto(ctx, c, who, spec(tokens(150+10*i, i+1), "x-laneway-tenant", who), queued)
		p.Metrics.Await(t, float64(i+1), "dynamo_frontend_router_queue_pending_requests", "policy_class", "shared")
	}
	// Queued now: a 150+170+190 = 510 tokens in 3, b 160+180 = 340 in 2.
	page := lanewayStatus(t, p)
	cls := page.Classes[0]
	wantQueued := []status.TenantQueued{{Tenant: "a", Pending: 3, PendingRawISLTokens: 510}, {Tenant: "b", Pending: 2, PendingRawISLTokens: 340}}
	if cls.Name != "shared" || cls.Pending != 5 || cls.PendingRawISLTokens != 850 || cls.TenantsActive != 2 || !slices.Equal(cls.TopQueued, wantQueued) {
		t.Fatalf("status before any release: %+v, want 5 queued (850 tokens), tenants %v", cls, wantQueued)
	}
	// The first grant went to a directly (500 tokens). Release two more:
	// the tenant DRR serves a then b.
	served, holder := releaseOneByOne(t, holder, queued, 2)
	if !slices.Equal(served, []string{"a", "b"}) {
		t.Fatalf("released %v, want a then b", served)
	}
	page = lanewayStatus(t, p)
	cls = page.Classes[0]
	wantServed := []status.TenantServed{{Tenant: "a", UncachedTokens: 650}, {Tenant: "b", UncachedTokens: 160}}
	if cls.Dispatched != 3 || !slices.Equal(cls.TopServed, wantServed) || cls.Pending != 3 {
		t.Fatalf("status after two releases: dispatched %d, served %v, pending %d; want 3, %v, 3", cls.Dispatched, cls.TopServed, cls.Pending, wantServed)
	}
	// Both were backlogged (each had a queued grant): Jain's index over
	// their tokens, 650 and 160.
	if want := 810.0 * 810 / (2 * (650*650 + 160*160)); cls.JainIndex == nil || *cls.JainIndex != want || cls.BackloggedTenants != 2 {
		t.Errorf("jain index %v over %d tenants, want %v over 2", cls.JainIndex, cls.BackloggedTenants, want)
	}
	_, holder = releaseOneByOne(t, holder, queued, 3)
	completeStream(t, holder)
	table := bins.RunLaneway(t, "status", "--epp", p.StatusAddr)
	for _, want := range []string{"class shared", "queued by tenant", "served, last minute", "endpoint", "127.0.0.2:8000"} {
		if !strings.Contains(table, want) {
			t.Errorf("status table lacks %q:\n%s", want, table)
		}
	}
	for _, line := range strings.Split(table, "\n") {
		if n := len([]rune(line)); n > 80 {
			t.Errorf("status line of %d columns: %q", n, line)
		}
	}
}

func lanewayStatus(t *testing.T, p *launch.EPP) status.Page {
	t.Helper()
	var page status.Page
	bins.ReadStatus(t, p, &page)
	if len(page.Classes) != 1 {
		t.Fatalf("status page classes %+v, want one", page.Classes)
	}
	return page
}

// liftPolicy lets anonymous callers use regular only, while the model
// profile "special" has no class but premium: resolving a request for
// special inside the binding is impossible, so the policy is refused.
const liftPolicy = `identity: {header: x-tenant-id}
default_tenant: {allowed: [regular], default_family: regular}
default_policy_family: regular
uncached_isl_buckets: [{min_tokens: 0, bucket: all}]
policy_classes:
  - {name: premium, policy_family: premium, cache_bucket: all, queue_policy: fcfs, quantum: 512}
  - {name: regular, policy_family: regular, cache_bucket: all, queue_policy: fcfs, quantum: 128}
models:
  special:
    policy_classes:
      - {name: premium, queue_policy: fcfs, quantum: 512}
`

// TestModelProfileCannotLiftTenant: a policy in which a model profile has
// no class a binding allows is refused, by laneway validate and by the
// picker at start and on reload, naming the binding and the model; before,
// an anonymous request for that model was dispatched to special/premium,
// outside its binding's allowed classes.
func TestModelProfileCannotLiftTenant(t *testing.T) {
	path := writePolicy(t, liftPolicy)
	wantIn := func(what, out string) {
		t.Helper()
		// The picker's log quotes the message as JSON: no quotes here.
		for _, w := range []string{"default_tenant", "allowed [regular] names no class of model", "special"} {
			if !strings.Contains(out, w) {
				t.Errorf("%s does not name %q:\n%s", what, w, out)
			}
		}
	}
	out, err := exec.Command(bins.Laneway, "validate", path).CombinedOutput()
	if err == nil {
		t.Errorf("laneway validate accepted the policy:\n%s", out)
	}
	wantIn("laneway validate", string(out))

	ctx := testCtx(t)
	cmd := exec.CommandContext(ctx, bins.Epp, "--secure-serving=false", "--bind-address=127.0.0.1", "--grpc-port=0",
		"--grpc-health-port=0", "--metrics-port=0", "--status-port=-1", "--endpoints=127.0.0.2:8000", "--policy-config="+path)
	out, err = cmd.CombinedOutput()
	if err == nil || ctx.Err() != nil {
		t.Errorf("the picker did not refuse the policy at start (err %v):\n%s", err, out)
	}
	wantIn("the picker's refusal", string(out))

	// A picker running a valid policy keeps it when the file changes to
	// this one, and routes the request for special inside regular.
	ok := writePolicy(t, trustPolicy("identity: {header: x-tenant-id}"))
	p := startEPP(t, launch.EPPOptions{Endpoints: []string{"127.0.0.2:8000"}, Policy: ok,
		Args: []string{"--policy-poll-interval=50ms"}})
	replaceFile(t, ok, liftPolicy)
	p.WaitLog(t, "policy file rejected")
	c := p.Client(t, extprocclient.Options{})
	ex := mustStart(t, c, spec([]byte(`{"model":"special","prompt":[1,2,3]}`)))
	mustRoute(t, ex)
	completeStream(t, ex)
	p.Metrics.Await(t, 1, "laneway_dispatches_total", "policy_class", "regular")
}

// liveHeap forces a collection in the picker (its pprof heap profile with
// gc=1) and returns its live heap (go_memstats_heap_alloc_bytes).
func liveHeap(t *testing.T, p *launch.EPP, pprofPort int) float64 {
	t.Helper()
	resp, err := (&http.Client{Timeout: launch.EventTimeout}).Get("http://" + launch.HostPort("127.0.0.1", pprofPort) + "/debug/pprof/heap?gc=1")
	if err != nil {
		t.Fatalf("pprof heap: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return p.Metrics.Value(t, "go_memstats_heap_alloc_bytes")
}

// TestTenantNamesDoNotPinHeaders: requests with distinct tenants and a 16
// KiB header each leave the picker's live heap with their tenants' names,
// not their header blocks: a tenant kept for the status page's minute (or
// a queue) is a copy of its name, not a piece of the block all the
// request's header values share. Before, 2,000 such requests kept 32 MiB
// alive for the minute.
func TestTenantNamesDoNotPinHeaders(t *testing.T) {
	const (
		requests = 2000
		padding  = 16 << 10
		workers  = 8
	)
	port, err := launch.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	// A tenant-fair class: the status page keeps who was served.
	p := startEPP(t, launch.EPPOptions{Endpoints: []string{"127.0.0.2:8000"}, Args: []string{"--pprof-port=" + strconv.Itoa(port)},
		Policy: writePolicy(t, "policy_classes:\n  - {name: shared, quantum: 100, tenant_fairness: true}\n")})
	c := p.Client(t, extprocclient.Options{})
	before := liveHeap(t, p, port)
	pad := strings.Repeat("p", padding)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < requests; i += workers {
				ex, err := c.Start(testCtx(t), spec(tokens(8, i), "x-laneway-tenant", fmt.Sprintf("tenant-%05d", i), "x-pad", pad))
				if err != nil {
					errs <- err
					return
				}
				if !ex.Decision().Routed() {
					errs <- fmt.Errorf("request %d not routed: %+v", i, ex.Decision().Immediate)
					return
				}
				if _, _, err := ex.Respond(http.StatusOK, nil, []byte("data: [DONE]\n\n")); err != nil {
					errs <- err
					return
				}
				_ = ex.Close()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var page status.Page
	bins.ReadStatus(t, p, &page)
	if got := page.Classes[0].Dispatched; got != requests {
		t.Fatalf("status page: %d dispatched in the last minute, want %d: the window does not hold the tenants", got, requests)
	}
	grown := liveHeap(t, p, port) - before
	t.Logf("live heap grew %.1f MiB for %d tenants (their header blocks: %d MiB)", grown/(1<<20), requests, requests*padding>>20)
	if limit := float64(requests * padding / 4); grown > limit {
		t.Errorf("live heap grew %.1f MiB, over %.1f MiB: the tenants' header blocks are kept", grown/(1<<20), limit/(1<<20))
	}
}

// TestUntrustedClientHints: with --trust-client-hints=false (the chart's
// default) and no identity, a client's hints and tenant name count for
// nothing: a strict-priority header does not jump the queue, a class
// header does not pick the class, and rotating tenant names does not get
// past a per-tenant limit (every such request is the anonymous tenant).
// Before, a x-laneway-strict-priority header jumped 16 queued requests and
// rotating names got 50 requests past a limit of 2.
func TestUntrustedClientHints(t *testing.T) {
	launch.CheckGoroutines(t)
	p := startEPP(t, launch.EPPOptions{Endpoints: []string{"127.0.0.2:8000"}, Args: []string{"--trust-client-hints=false"},
		Policy: writePolicy(t, `
default_tenant: {request_queue_limit: 4}
policy_classes:
  - {name: standard, quantum: 1, prefill_busy_threshold: 100, tenant_fairness: true}
  - {name: premium, quantum: 1000, prefill_busy_threshold: 100}
`)})
	if !strings.Contains(p.Log.String(), "client hints are ignored") {
		t.Errorf("the startup log does not say that client hints are ignored:\n%s", p.Log.Tail(4096))
	}
	c := p.Client(t, extprocclient.Options{})
	holder := mustStart(t, c, spec(tokens(500, 0)))
	mustRoute(t, holder)
	ctx := testCtx(t)
	released := make(chan started, 8)
	queue := []struct {
		name    string
		headers []string
	}{
		{"first", []string{"x-laneway-tenant", "t1"}},
		{"second", []string{"x-laneway-tenant", "t2"}},
		{"third", []string{"x-laneway-tenant", "t3"}},
		{"jumper", []string{"x-laneway-tenant", "t4", "x-laneway-strict-priority", "4294967295", "x-laneway-policy-class", "premium", "x-laneway-priority", "1000"}},
	}
	for i, q := range queue {
		startInto(ctx, c, q.name, spec(tokens(150, i+1), q.headers...), released)
		p.Metrics.Await(t, float64(i+1), "dynamo_frontend_router_queue_pending_requests", "policy_class", "standard")
	}
	// A fifth name is the same anonymous tenant: its limit of 4 is full.
	fifth := mustStart(t, c, spec(tokens(150, 9), "x-laneway-tenant", "t5"))
	immediate(t, fifth, 429, "queue_limit")
	order, holder := releaseOneByOne(t, holder, released, len(queue))
	completeStream(t, holder)
	if want := []string{"first", "second", "third", "jumper"}; !slices.Equal(order, want) {
		t.Errorf("release order %q, want arrival order %q", order, want)
	}
	if got := p.Metrics.Value(t, "laneway_dispatches_total", "policy_class", "premium"); got != 0 {
		t.Errorf("%v dispatches in premium, want none: the class header counts for nothing", got)
	}
}
