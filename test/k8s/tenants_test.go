package k8s

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/laneway-dev/laneway/api/v1alpha1"
	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

// identityHeader is the header the test's "gateway" sets after
// authentication.
const identityHeader = "x-tenant-id"

// tenantRequest is request(class) sent by tenant id ("" for none).
func tenantRequest(id, class string) extprocclient.RequestSpec {
	s := request(class)
	if id != "" {
		s.Headers.Set(identityHeader, id)
	}
	return s
}

// TestTenantsFromProfile: a PolicyProfile with an identity header and a
// binding decides the class from who the caller is: acme, bound to silver,
// lands in silver although its class header names gold, and a caller no
// binding matches lands in the default binding's gold although it asks for
// silver. The profile's status shows the identity source and the binding
// count. Then, with acme's requests queued behind a busy pod, the binding
// moves acme to gold: the queued requests move with it, none is lost or
// answered twice, and they are dispatched as gold.
func TestTenantsFromProfile(t *testing.T) {
	e := newEnv(t, false)
	e.createPool("pool", "llm")
	a := e.addPod("a", podSpec{app: "llm", ready: true})
	// Threshold 0: one request in prefill makes the pod busy for both.
	e.create(policyClass("gold", "pool", 1, ptr.To[int64](0)))
	e.create(policyClass("silver", "pool", 1, ptr.To[int64](0)))
	prof := &v1alpha1.PolicyProfile{ObjectMeta: metav1.ObjectMeta{Name: "pool"}}
	prof.Spec.PoolRef.Name = "pool"
	prof.Spec.Identity = &v1alpha1.Identity{Header: identityHeader}
	prof.Spec.Tenants = []v1alpha1.TenantBinding{{
		Name:         "acme",
		Match:        v1alpha1.TenantMatch{Exact: []string{"acme"}},
		TenantRights: v1alpha1.TenantRights{Allowed: []string{"silver"}, DefaultFamily: "silver"},
	}}
	prof.Spec.DefaultTenant = &v1alpha1.TenantRights{Allowed: []string{"gold"}, DefaultFamily: "gold"}
	e.create(prof)

	p := e.startEPP("epp", "pool")
	p.waitReady()
	e.waitProfile("pool", "accepted with its tenant summary", func(pp *v1alpha1.PolicyProfile) bool {
		return profileAccepted("True", "Accepted")(pp) && pp.Status.Identity == "header "+identityHeader && pp.Status.TenantBindings == 1
	})
	p.waitEndpoints(time.Now(), followLimit, a.addr(e.port))

	dispatchedAs := func(spec extprocclient.RequestSpec, class string) {
		t.Helper()
		before := p.Metrics.Value(t, "laneway_dispatches_total", "policy_class", class)
		serve(t, p.start(ctx(t), spec))
		if after := p.Metrics.Value(t, "laneway_dispatches_total", "policy_class", class); after != before+1 {
			t.Fatalf("tenant %q asking for %q: dispatches of %q went %v -> %v, want +1",
				spec.Headers.Get(identityHeader), spec.Headers.Get(classHeader), class, before, after)
		}
	}
	dispatchedAs(tenantRequest("acme", "gold"), "silver")   // not allowed: its default
	dispatchedAs(tenantRequest("acme", ""), "silver")       // no class: its default
	dispatchedAs(tenantRequest("globex", "silver"), "gold") // the default binding
	dispatchedAs(tenantRequest("", "silver"), "gold")       // anonymous: the default binding
	dispatchedAs(tenantRequest("ACME", "silver"), "gold")   // identities match exactly

	// acme's requests queue in silver behind a busy pod.
	const queued = 20
	blocker := p.start(ctx(t), tenantRequest("globex", ""))
	answers := make(chan result, queued)
	for range queued {
		go func() {
			ex, err := p.client.Start(context.Background(), tenantRequest("acme", "gold"))
			answers <- result{ex: ex, err: err, at: time.Now()}
		}()
	}
	p.Metrics.Await(t, queued, "dynamo_frontend_router_queue_pending_requests", "policy_class", "silver")

	// The binding moves acme to gold while they wait.
	var cur v1alpha1.PolicyProfile
	if err := admin.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: "pool"}, &cur); err != nil {
		t.Fatal(err)
	}
	base := cur.DeepCopy()
	cur.Spec.Tenants[0].Allowed, cur.Spec.Tenants[0].DefaultFamily = []string{"gold"}, "gold"
	// A merge patch: the picker writes the profile's status meanwhile.
	if err := admin.Patch(ctx(t), &cur, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	gen := cur.Generation
	e.waitProfile("pool", "accepted at the new generation", func(pp *v1alpha1.PolicyProfile) bool {
		return pp.Generation == gen && profileAccepted("True", "Accepted")(pp)
	})
	p.Metrics.Await(t, queued, "dynamo_frontend_router_queue_pending_requests", "policy_class", "gold")
	p.Metrics.Await(t, 0, "dynamo_frontend_router_queue_pending_requests", "policy_class", "silver")

	goldBefore := p.Metrics.Value(t, "laneway_dispatches_total", "policy_class", "gold")
	serve(t, blocker)
	for i := range queued {
		r := launch.Receive(t, answers, fmt.Sprintf("queued request %d of %d dispatched", i+1, queued))
		if r.err != nil {
			t.Fatalf("queued request %d: %v", i, r.err)
		}
		serve(t, r.ex)
	}
	select {
	case r := <-answers:
		t.Fatalf("a request answered twice: %+v", r)
	default:
	}
	if got := p.Metrics.Value(t, "laneway_dispatches_total", "policy_class", "gold") - goldBefore; got != queued {
		t.Errorf("%v of the %d queued acme requests dispatched as gold after the binding moved them", got, queued)
	}
	if n := p.Metrics.Value(t, "laneway_rejections_total"); n != 0 {
		t.Errorf("%v requests rejected, want none", n)
	}
	// New requests follow the new binding too.
	dispatchedAs(tenantRequest("acme", "silver"), "gold")
}
