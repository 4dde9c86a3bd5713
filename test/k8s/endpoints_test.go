package k8s

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/laneway-dev/laneway/internal/controller"
	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

// followLimit is the brief's bound for the picker to follow a pod change
// (readiness, deletion, labels): measured from the API write returning to
// the picker's endpoint set showing it.
const followLimit = time.Second

// TestEndpointsFollowPods: each ready pod × target port is an endpoint;
// readiness, deletion, label, selector, target-port and active-ports
// changes are followed within a second.
func TestEndpointsFollowPods(t *testing.T) {
	e := newEnv(t, false)
	e.createPool("pool", "llm")
	a := e.addPod("a", podSpec{app: "llm", ready: true})
	b := e.addPod("b", podSpec{app: "llm", ready: true})
	e.addPod("unready", podSpec{app: "llm", ready: false})
	e.addPod("other", podSpec{app: "other", ready: true})
	p := e.startEPP("epp", "pool")
	p.waitReady()
	p.waitEndpoints(time.Now(), followLimit, a.addr(e.port), b.addr(e.port))

	var lat []time.Duration
	step := func(what string, change func(), want ...string) {
		t.Helper()
		t0 := time.Now()
		change()
		d := p.waitEndpoints(t0, followLimit, want...)
		lat = append(lat, d)
		t.Logf("%-40s followed in %v", what, d.Round(100*time.Microsecond))
	}
	step("pod b not ready", func() { e.setReady("b", false) }, a.addr(e.port))
	step("pod b ready again", func() { e.setReady("b", true) }, a.addr(e.port), b.addr(e.port))
	step("pod a label no longer matches", func() {
		e.updatePod("a", false, func(p *corev1.Pod) { p.Labels["app"] = "retired" })
	}, b.addr(e.port))
	step("pod a label matches again", func() {
		e.updatePod("a", false, func(p *corev1.Pod) { p.Labels["app"] = "llm" })
	}, a.addr(e.port), b.addr(e.port))
	step("pod a deleted", func() { e.deletePod("a") }, b.addr(e.port))
	c := e.addPod("c", podSpec{app: "llm", ready: false})
	step("new pod c ready", func() { e.setReady("c", true) }, b.addr(e.port), c.addr(e.port))

	// Selector and port changes of the pool resync every pod.
	step("pool selects app=other", func() {
		e.updatePool("pool", func(pl *inferencev1.InferencePool) {
			pl.Spec.Selector.MatchLabels = map[inferencev1.LabelKey]inferencev1.LabelValue{"app": "other"}
		})
	}, addrOf(e, "other"))
	step("pool selects app=llm again", func() {
		e.updatePool("pool", func(pl *inferencev1.InferencePool) {
			pl.Spec.Selector.MatchLabels = map[inferencev1.LabelKey]inferencev1.LabelValue{"app": "llm"}
		})
	}, b.addr(e.port), c.addr(e.port))
	second, err := launch.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	step("pool gains a second target port", func() {
		e.updatePool("pool", func(pl *inferencev1.InferencePool) {
			pl.Spec.TargetPorts = append(pl.Spec.TargetPorts, inferencev1.Port{Number: inferencev1.PortNumber(second)})
		})
	}, b.addr(e.port), b.addr(second), c.addr(e.port), c.addr(second))
	step("pod c active-ports narrows to the second", func() {
		e.updatePod("c", false, func(p *corev1.Pod) {
			p.Annotations = map[string]string{controller.AnnotationActivePorts: strconv.Itoa(second)}
		})
	}, b.addr(e.port), b.addr(second), c.addr(second))

	slices.Sort(lat)
	t.Logf("endpoint propagation over %d changes: median %v, max %v (limit %v)",
		len(lat), lat[len(lat)/2].Round(100*time.Microsecond), lat[len(lat)-1].Round(100*time.Microsecond), followLimit)
}

// addrOf finds the endpoint of the test's one pod named name.
func addrOf(e *env, name string) string {
	e.t.Helper()
	var p corev1.Pod
	if err := admin.Get(ctx(e.t), client.ObjectKey{Namespace: e.ns, Name: name}, &p); err != nil {
		e.t.Fatal(err)
	}
	return pod{ip: p.Status.PodIP}.addr(e.port)
}

func (e *env) updatePool(name string, change func(*inferencev1.InferencePool)) {
	e.t.Helper()
	var pl inferencev1.InferencePool
	if err := admin.Get(ctx(e.t), client.ObjectKey{Namespace: e.ns, Name: name}, &pl); err != nil {
		e.t.Fatal(err)
	}
	change(&pl)
	if err := admin.Update(ctx(e.t), &pl); err != nil {
		e.t.Fatalf("update InferencePool %s: %v", name, err)
	}
}

// TestTaintedEndpoints: a NoSchedule-annotated pod and a pod being deleted
// (graceful, still Ready) keep their endpoints for pinned requests but take
// no unpinned ones; once the pod is gone a pinned request gets 503.
func TestTaintedEndpoints(t *testing.T) {
	e := newEnv(t, false)
	e.createPool("pool", "llm")
	a := e.addPod("a", podSpec{app: "llm", ready: true})
	b := e.addPod("b", podSpec{app: "llm", ready: true, finalizers: []string{"laneway.dev/test-hold"}})
	c := e.addPod("c", podSpec{app: "llm", ready: true, annotations: map[string]string{controller.AnnotationTaint: controller.TaintNoSchedule}})
	p := e.startEPP("epp", "pool")
	p.waitReady()
	p.waitEndpoints(time.Now(), followLimit, a.addr(e.port), b.addr(e.port), c.addr(e.port))

	// pickedUnpinned holds n unpinned requests open at once (so the
	// least-loaded pick spreads them) and returns where they went.
	pickedUnpinned := func(n int) map[string]int {
		t.Helper()
		got := map[string]int{}
		var open []func()
		for range n {
			ex := p.start(ctx(t), request(""))
			got[routed(t, ex)]++
			open = append(open, func() { serve(t, ex) })
		}
		for _, f := range open {
			f()
		}
		return got
	}
	pinned := func(addr string) {
		t.Helper()
		ex := p.start(ctx(t), request("", addr))
		if got := routed(t, ex); got != addr {
			t.Fatalf("pinned to %s, routed to %s", addr, got)
		}
		serve(t, ex)
	}

	if got := pickedUnpinned(6); got[c.addr(e.port)] != 0 || got[a.addr(e.port)] == 0 || got[b.addr(e.port)] == 0 {
		t.Fatalf("unpinned picks %v: want a and b, never the NoSchedule pod c", got)
	}
	pinned(c.addr(e.port))

	// b is deleted but held by a finalizer: being deleted, still Ready.
	e.deletePod("b")
	var held corev1.Pod
	if err := admin.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: "b"}, &held); err != nil || held.DeletionTimestamp == nil {
		t.Fatalf("pod b should be terminating: %v %v", err, held.DeletionTimestamp)
	}
	// The taint is not visible in the endpoint set; unpinned picks show it.
	var got map[string]int
	launch.WaitWithin(t, followLimit, func() string { return fmt.Sprintf("unpinned picks %v still include the terminating pod b", got) }, func() bool {
		got = pickedUnpinned(4)
		return got[b.addr(e.port)] == 0 && got[c.addr(e.port)] == 0
	})
	pinned(b.addr(e.port))

	// Untainting c brings it back into unpinned picks.
	e.updatePod("c", false, func(p *corev1.Pod) { delete(p.Annotations, controller.AnnotationTaint) })
	launch.WaitWithin(t, followLimit, func() string { return fmt.Sprintf("pod c not picked after removing its taint: %v", got) }, func() bool {
		got = pickedUnpinned(4)
		return got[c.addr(e.port)] > 0
	})

	// The finalizer goes, the pod goes, and so does its endpoint: a pinned
	// request now gets 503.
	t0 := time.Now()
	e.updatePod("b", false, func(p *corev1.Pod) { p.Finalizers = nil })
	d := p.waitEndpoints(t0, followLimit, a.addr(e.port), c.addr(e.port))
	t.Logf("terminated pod removed in %v", d.Round(100*time.Microsecond))
	ex := p.start(ctx(t), request("", b.addr(e.port)))
	if dec := ex.Decision(); dec.Routed() || dec.Immediate.Status != 503 {
		t.Fatalf("pinned to the removed pod: %+v, want 503", dec)
	}
	_ = ex.Close()
}

// TestMaxBatchedTokensAnnotation: the per-pod annotation replaces
// --max-num-batched-tokens in prefill_busy_threshold_frac: with frac 0.5
// and 10 tokens a pinned request makes the pod busy, so the next one waits;
// with the default 8192 both go at once.
func TestMaxBatchedTokensAnnotation(t *testing.T) {
	e := newEnv(t, false)
	e.createPool("pool", "llm")
	small := e.addPod("small", podSpec{app: "llm", ready: true, annotations: map[string]string{controller.AnnotationMaxBatchedTokens: "10"}})
	big := e.addPod("big", podSpec{app: "llm", ready: true})
	pc := policyClass("frac", "pool", 100, nil)
	pc.Spec.PrefillBusyThreshold = nil // a fraction instead (auto and none do not go with one)
	pc.Spec.PrefillBusyThresholdFrac = ptr.To("0.5")
	e.create(pc)
	p := e.startEPP("epp", "pool")
	p.waitReady()
	e.waitClass("frac", "accepted", accepted("True", "Accepted"))

	// Two requests pinned to big: 8192 × 0.5 is far above one prompt.
	first := p.start(ctx(t), request("", big.addr(e.port)))
	second := p.start(ctx(t), request("", big.addr(e.port)))
	routed(t, first)
	routed(t, second)
	serve(t, first)
	serve(t, second)

	// Two pinned to small: the first's prompt is above 10 × 0.5.
	first = p.start(ctx(t), request("", small.addr(e.port)))
	routed(t, first)
	done := startAsync(p, request("", small.addr(e.port)))
	p.Metrics.Await(t, 1, "dynamo_frontend_router_queue_pending_requests", "policy_class", "frac")
	select {
	case r := <-done:
		t.Fatalf("second request to the 10-token pod was not held: %+v", r)
	default:
	}
	serve(t, first) // its first byte ends its prefill: the second goes
	r := launch.Receive(t, done, "the held request's decision once the first one's prefill ended")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got := routed(t, r.ex); got != small.addr(e.port) {
		t.Fatalf("held request went to %s, want %s", got, small.addr(e.port))
	}
	serve(t, r.ex)
}

// result is the outcome of an exchange started in the background.
type result struct {
	ex  *extprocclient.Exchange
	err error
	at  time.Time // when the decision came
}

// startAsync starts an exchange on its own goroutine (it may wait in the
// picker's queue) and delivers its decision on the returned channel.
func startAsync(p *eppProc, spec extprocclient.RequestSpec) <-chan result {
	ch := make(chan result, 1)
	go func() {
		ex, err := p.client.Start(context.Background(), spec)
		ch <- result{ex: ex, err: err, at: time.Now()}
	}()
	return ch
}
