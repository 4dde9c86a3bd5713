package k8s

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/laneway-dev/laneway/api/v1alpha1"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

// TestPinnedRequestOnDeletedPod: a request pinned (one-entry subset hint)
// to a busy pod waits in that pod's exact lane; deleting the pod answers it
// 503 within a second.
func TestPinnedRequestOnDeletedPod(t *testing.T) {
	e := newEnv(t, false)
	e.createPool("pool", "llm")
	a := e.addPod("a", podSpec{app: "llm", ready: true})
	b := e.addPod("b", podSpec{app: "llm", ready: true})
	// Threshold 0: any prompt in prefill makes the pod busy.
	e.create(policyClass("lane", "pool", 100, ptr.To[int64](0)))
	p := e.startEPP("epp", "pool")
	p.waitReady()
	e.waitClass("lane", "accepted", accepted("True", "Accepted"))

	blocker := p.start(ctx(t), request("", a.addr(e.port)))
	if got := routed(t, blocker); got != a.addr(e.port) {
		t.Fatalf("blocker routed to %s", got)
	}
	waiting := startAsync(p, request("", a.addr(e.port)))
	p.Metrics.Await(t, 1, "dynamo_frontend_router_queue_pending_requests", "policy_class", "lane")
	// An unpinned request is not held by a's lane: it goes to b.
	other := p.start(ctx(t), request(""))
	if got := routed(t, other); got != b.addr(e.port) {
		t.Fatalf("unpinned request routed to %s while a is busy, want %s", got, b.addr(e.port))
	}

	t0 := time.Now()
	e.deletePod("a")
	r := launch.Receive(t, waiting, "the pinned request's answer after its pod was deleted")
	lat := r.at.Sub(t0)
	if r.err != nil {
		t.Fatal(r.err)
	}
	d := r.ex.Decision()
	if d.Routed() || d.Immediate.Status != 503 {
		t.Fatalf("pinned request on the deleted pod: %+v, want 503", d)
	}
	if reason := d.Immediate.Headers.Get("x-laneway-reason"); reason != "no_endpoints" {
		t.Errorf("503 reason %q, want no_endpoints", reason)
	}
	t.Logf("pinned request answered 503 %v after its pod's deletion returned (limit %v)", lat.Round(100*time.Microsecond), followLimit)
	if lat > followLimit {
		t.Errorf("pinned 503 took %v, want within %v", lat, followLimit)
	}
	_ = r.ex.Close()
	// The dispatched requests finish normally, the removed pod's included.
	serve(t, blocker)
	serve(t, other)
	p.waitEndpoints(time.Now(), followLimit, b.addr(e.port))
}

// TestInvalidPolicyKeepsLastGood: without objects the synthetic default
// class schedules; a valid set is applied and Accepted; an invalid change
// gets Accepted=False with the validation message and the last good policy
// keeps scheduling; fixing it applies the new set.
func TestInvalidPolicyKeepsLastGood(t *testing.T) {
	e := newEnv(t, false)
	e.createPool("pool", "llm")
	e.addPod("a", podSpec{app: "llm", ready: true})
	p := e.startEPP("epp", "pool")
	p.waitReady()

	dispatchedAs := func(header, class string) {
		t.Helper()
		before := p.Metrics.Value(t, "laneway_dispatches_total", "policy_class", class)
		serve(t, p.start(ctx(t), request(header)))
		if after := p.Metrics.Value(t, "laneway_dispatches_total", "policy_class", class); after != before+1 {
			t.Fatalf("request with class header %q: dispatches of class %q went %v -> %v, want +1", header, class, before, after)
		}
	}
	dispatchedAs("", "default")

	e.create(policyClass("gold", "pool", 100, nil))
	e.create(policyClass("silver", "pool", 100, nil))
	e.waitClass("gold", "accepted", accepted("True", "Accepted"))
	e.waitClass("silver", "accepted", accepted("True", "Accepted"))
	dispatchedAs("silver", "silver")
	dispatchedAs("", "gold") // no header: the alphabetically first class
	p.Metrics.Await(t, 1, "laneway_policy_accepted")

	// dup reuses gold's class name: the set is invalid. bronze, fine on
	// its own, comes after and is held back with the rest.
	dup := policyClass("dup", "pool", 100, nil)
	dup.Spec.ClassName = "gold"
	e.create(dup)
	e.create(policyClass("bronze", "pool", 100, nil))
	bad := e.waitClass("dup", "rejected", accepted("False", v1alpha1.ReasonInvalid))
	msg := acceptedCondition(bad).Message
	if !strings.Contains(msg, `"gold"`) {
		t.Errorf("dup's Accepted message %q does not name the duplicated class", msg)
	}
	t.Logf("invalid set: dup Accepted=False: %s", msg)
	bronze := e.waitClass("bronze", "held back", accepted("False", v1alpha1.ReasonPolicyInvalid))
	t.Logf("bronze Accepted=False/%s: %s", v1alpha1.ReasonPolicyInvalid, acceptedCondition(bronze).Message)
	p.Metrics.Await(t, 0, "laneway_policy_accepted") // from 1: the rejection is visible
	// The old policy still schedules: bronze is unknown there, so its
	// requests go to the default class, gold.
	dispatchedAs("bronze", "gold")
	dispatchedAs("silver", "silver")

	if err := admin.Delete(ctx(t), dup); err != nil {
		t.Fatal(err)
	}
	e.waitClass("bronze", "accepted", accepted("True", "Accepted"))
	dispatchedAs("bronze", "bronze")
	dispatchedAs("", "bronze") // now the alphabetically first

	// A PolicyProfile names the default class; it is judged and reported
	// with the classes.
	prof := &v1alpha1.PolicyProfile{ObjectMeta: metav1.ObjectMeta{Name: "pool"}}
	prof.Spec.PoolRef.Name = "pool"
	prof.Spec.DefaultPolicyClass = "silver"
	e.create(prof)
	e.waitProfile("pool", "accepted", profileAccepted("True", "Accepted"))
	dispatchedAs("", "silver")
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := admin.Get(ctx(t), client.ObjectKeyFromObject(prof), prof); err != nil {
			return err
		}
		prof.Spec.DefaultPolicyClass = "platinum" // no such class
		return admin.Update(ctx(t), prof)
	})
	if err != nil {
		t.Fatal(err)
	}
	got := e.waitProfile("pool", "rejected", profileAccepted("False", v1alpha1.ReasonInvalid))
	t.Logf("profile naming a missing default class: %s", apimeta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionAccepted).Message)
	dispatchedAs("", "silver")
}

// TestQuantumChangeUnderLoad: 240 requests of two classes wait behind a
// busy pod; 40 are served at quanta 1:1, then alpha's quantum goes to 3
// with 200 still queued. From then on alpha gets three of every four
// dispatches until it drains, and every request is answered exactly once.
// The classes' status.pending reports the queue.
func TestQuantumChangeUnderLoad(t *testing.T) {
	e := newEnv(t, false)
	e.createPool("pool", "llm")
	a := e.addPod("a", podSpec{app: "llm", ready: true})
	e.create(policyClass("alpha", "pool", 1, ptr.To[int64](0)))
	e.create(policyClass("beta", "pool", 1, ptr.To[int64](0)))
	p := e.startEPP("epp", "pool")
	p.waitReady()
	e.waitClass("alpha", "accepted", accepted("True", "Accepted"))
	e.waitClass("beta", "accepted", accepted("True", "Accepted"))
	p.waitEndpoints(time.Now(), followLimit, a.addr(e.port))

	const perClass = 120
	blocker := p.start(ctx(t), request("alpha"))
	type answer struct {
		i int
		result
	}
	classOf := make([]string, 2*perClass)
	answers := make(chan answer, len(classOf))
	for i := range classOf {
		classOf[i] = "alpha"
		if i%2 == 1 {
			classOf[i] = "beta"
		}
		go func() {
			ex, err := p.client.Start(context.Background(), request(classOf[i]))
			answers <- answer{i, result{ex: ex, err: err, at: time.Now()}}
		}()
	}
	// status.pending is the leader's queue, refreshed every 200 ms here.
	for _, c := range []string{"alpha", "beta"} {
		e.waitClass(c, "pending 120", func(pc *v1alpha1.PolicyClass) bool { return pc.Status.Pending == perClass })
	}

	// Serve one dispatched request at a time: its first response byte ends
	// its prefill, which lets exactly the next one through.
	answered := make([]int, len(classOf))
	var order []string
	next := func() {
		t.Helper()
		a := launch.Receive(t, answers, fmt.Sprintf("a dispatch after %d", len(order)))
		if a.err != nil {
			t.Fatalf("request %d: %v", a.i, a.err)
		}
		answered[a.i]++
		order = append(order, classOf[a.i])
		serve(t, a.ex)
	}
	serve(t, blocker)
	for range 40 {
		next()
	}
	if n := count(order, "alpha"); n < 19 || n > 21 {
		t.Fatalf("quanta 1:1: alpha got %d of the first 40 dispatches, want 20±1 (%v)", n, order)
	}

	var pc v1alpha1.PolicyClass
	if err := admin.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: "alpha"}, &pc); err != nil {
		t.Fatal(err)
	}
	// A merge patch, not an Update: the picker writes status.pending all
	// the while, so a read-modify-write would race its resourceVersion.
	base := pc.DeepCopy()
	pc.Spec.Quantum = 3
	if err := admin.Patch(ctx(t), &pc, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	gen := pc.Generation
	e.waitClass("alpha", "accepted at the new generation", func(x *v1alpha1.PolicyClass) bool {
		return x.Generation == gen && accepted("True", "Accepted")(x)
	})
	if q := len(classOf) - len(order); q != 200 {
		t.Fatalf("%d requests queued at the quantum change, want 200", q)
	}

	for range 80 {
		next()
	}
	after := order[40:]
	if n := count(after, "alpha"); n < 57 || n > 63 {
		t.Errorf("quanta 3:1: alpha got %d of the 80 dispatches after the change, want 60±3 (%v)", n, after)
	}
	for len(order) < len(classOf) {
		next()
	}
	if n := count(order, "alpha"); n != perClass {
		t.Errorf("alpha dispatched %d times, want %d", n, perClass)
	}
	for i, n := range answered {
		if n != 1 {
			t.Errorf("request %d answered %d times", i, n)
		}
	}
	select {
	case a := <-answers:
		t.Errorf("request %d answered again: %+v", a.i, a.result)
	default:
	}
	p.Metrics.Await(t, float64(len(classOf)+1), "laneway_dispatches_total")
	if n := p.Metrics.Value(t, "laneway_rejections_total"); n != 0 {
		t.Errorf("%v requests rejected, want none", n)
	}
	for _, c := range []string{"alpha", "beta"} {
		e.waitClass(c, "pending 0", func(pc *v1alpha1.PolicyClass) bool { return pc.Status.Pending == 0 })
	}
	t.Logf("dispatch order after the change (a=alpha, b=beta): %s", compact(after))
}

func count(xs []string, v string) int {
	n := 0
	for _, x := range xs {
		if x == v {
			n++
		}
	}
	return n
}

func compact(xs []string) string {
	var b strings.Builder
	for _, x := range xs {
		b.WriteByte(x[0])
	}
	return b.String()
}

// TestInvalidPolicyAtStart: a picker whose pool's policy objects are
// invalid when it starts has no valid policy to serve with. It does not
// fall back to the synthetic default class (that would drop the
// operator's queueing and limits without a sign): it stays not ready,
// answers 503 policy_invalid, exports laneway_policy_accepted 0, logs the
// problems as an error, and the objects get Accepted=False. Fixing them
// makes it ready with the fixed policy.
func TestInvalidPolicyAtStart(t *testing.T) {
	e := newEnv(t, false)
	e.createPool("pool", "llm")
	e.addPod("a", podSpec{app: "llm", ready: true})
	e.create(policyClass("gold", "pool", 100, nil))
	dup := policyClass("dup", "pool", 100, nil)
	dup.Spec.ClassName = "gold" // two classes named gold: the set is invalid
	e.create(dup)
	p := e.startEPP("epp", "pool")
	w := p.watchReadiness()
	for _, name := range []string{"dup", "gold"} { // both break the rule
		e.waitClass(name, "rejected", accepted("False", v1alpha1.ReasonInvalid))
	}
	// 0, and exported: an absent series would read 0 as well.
	if v, found := p.Metrics.Read(t).Sum("laneway_policy_accepted"); !found || v != 0 {
		t.Fatalf("laneway_policy_accepted %v (exported %t) with invalid policy objects, want 0", v, found)
	}
	if st := health(t, p); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("readiness %v with invalid policy objects, want NOT_SERVING", st)
	}
	ex := p.start(ctx(t), request(""))
	if d := ex.Decision(); d.Routed() || d.Immediate.Status != 503 || d.Immediate.Headers.Get("x-laneway-reason") != "policy_invalid" {
		t.Fatalf("picker with invalid policy answered %+v, want 503 policy_invalid", d)
	}
	_ = ex.Close()
	if l := p.WaitLog(t, "no valid policy was ever applied"); !strings.Contains(l, `"level":"error"`) || !strings.Contains(l, `\"gold\"`) {
		t.Errorf("the rejection is not an error log naming the class: %s", l)
	}

	if err := admin.Delete(ctx(t), dup); err != nil {
		t.Fatal(err)
	}
	p.waitStatus(w, healthpb.HealthCheckResponse_SERVING, launch.EventTimeout)
	e.waitClass("gold", "accepted", accepted("True", "Accepted"))
	p.Metrics.Await(t, 1, "laneway_policy_accepted")
	before := p.Metrics.Value(t, "laneway_dispatches_total", "policy_class", "gold")
	serve(t, p.start(ctx(t), request("")))
	if after := p.Metrics.Value(t, "laneway_dispatches_total", "policy_class", "gold"); after != before+1 {
		t.Errorf("dispatches of gold %v -> %v, want +1", before, after)
	}
}
