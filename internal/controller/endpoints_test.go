package controller

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/laneway-dev/laneway/api/v1alpha1"
	"github.com/laneway-dev/laneway/pkg/sched"
)

func testPool(ports ...int32) *inferencev1.InferencePool {
	p := &inferencev1.InferencePool{}
	p.Spec.Selector.MatchLabels = map[inferencev1.LabelKey]inferencev1.LabelValue{"app": "llm"}
	for _, n := range ports {
		p.Spec.TargetPorts = append(p.Spec.TargetPorts, inferencev1.Port{Number: inferencev1.PortNumber(n)})
	}
	return p
}

type podOpt func(*corev1.Pod)

func testPod(name, ip string, opts ...podOpt) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{}}}
	p.Status.PodIP = ip
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	for _, o := range opts {
		o(&p)
	}
	return p
}

func notReady(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse }
func noConditions(p *corev1.Pod) {
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.ContainersReady, Status: corev1.ConditionTrue}}
}
func deleting(p *corev1.Pod) { now := metav1.Now(); p.DeletionTimestamp = &now }
func annotate(k, v string) podOpt {
	return func(p *corev1.Pod) { p.Annotations[k] = v }
}

func label(k, v string) podOpt {
	return func(p *corev1.Pod) {
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		p.Labels[k] = v
	}
}

func ep(addr string, maxTok uint64, tainted bool) sched.Endpoint {
	return sched.Endpoint{Addr: addr, MaxBatchedTokens: maxTok, Tainted: tainted}
}

// ranked is e with its data-parallel rank.
func ranked(e sched.Endpoint, rank int) sched.Endpoint { e.Rank = rank; return e }

func TestEndpoints(t *testing.T) {
	tests := []struct {
		name    string
		pool    *inferencev1.InferencePool
		pods    []corev1.Pod
		want    []sched.Endpoint
		wantBad []string // substrings of reported annotation problems
	}{
		{
			name: "each ready pod times each target port, sorted; a port's rank is its place in targetPorts",
			pool: testPool(8001, 8000),
			pods: []corev1.Pod{testPod("b", "10.0.0.2"), testPod("a", "10.0.0.1")},
			want: []sched.Endpoint{
				ranked(ep("10.0.0.1:8000", 100, false), 1), ep("10.0.0.1:8001", 100, false),
				ranked(ep("10.0.0.2:8000", 100, false), 1), ep("10.0.0.2:8001", 100, false),
			},
		},
		{
			name: "not ready, no Ready condition and no IP are not endpoints",
			pool: testPool(8000),
			pods: []corev1.Pod{testPod("a", "10.0.0.1", notReady), testPod("b", "10.0.0.2", noConditions), testPod("c", ""), testPod("d", "10.0.0.4")},
			want: []sched.Endpoint{ep("10.0.0.4:8000", 100, false)},
		},
		{
			name: "being deleted or NoSchedule: kept, tainted",
			pool: testPool(8000),
			pods: []corev1.Pod{
				testPod("a", "10.0.0.1", deleting),
				testPod("b", "10.0.0.2", annotate(AnnotationTaint, "NoSchedule")),
				testPod("c", "10.0.0.3", annotate(AnnotationTaint, "PreferNoSchedule")),
			},
			want: []sched.Endpoint{ep("10.0.0.1:8000", 100, true), ep("10.0.0.2:8000", 100, true), ep("10.0.0.3:8000", 100, false)},
		},
		{
			name: "active-ports narrows; foreign and malformed entries are reported and skipped",
			pool: testPool(8000, 8001, 8002),
			pods: []corev1.Pod{
				testPod("a", "10.0.0.1", annotate(AnnotationActivePorts, " 8002, 8000 ")),
				testPod("b", "10.0.0.2", annotate(AnnotationActivePorts, "8001,9999,x")),
			},
			want:    []sched.Endpoint{ep("10.0.0.1:8000", 100, false), ranked(ep("10.0.0.1:8002", 100, false), 2), ranked(ep("10.0.0.2:8001", 100, false), 1)},
			wantBad: []string{`"9999", "x" are not target ports`},
		},
		{
			name: "active-ports with no valid entry: no endpoint",
			pool: testPool(8000),
			pods: []corev1.Pod{testPod("a", "10.0.0.1", annotate(AnnotationActivePorts, ""))},
			want: nil,
		},
		{
			name: "max-num-batched-tokens annotation overrides the default; a bad one is reported",
			pool: testPool(8000),
			pods: []corev1.Pod{
				testPod("a", "10.0.0.1", annotate(AnnotationMaxBatchedTokens, "16384")),
				testPod("b", "10.0.0.2", annotate(AnnotationMaxBatchedTokens, "lots")),
				testPod("c", "10.0.0.3", annotate(AnnotationMaxBatchedTokens, "0")),
			},
			want:    []sched.Endpoint{ep("10.0.0.1:8000", 16384, false), ep("10.0.0.2:8000", 100, false), ep("10.0.0.3:8000", 100, false)},
			wantBad: []string{`"lots" is not a positive integer`, `"0" is not a positive integer`},
		},
		{
			name: "IPv6 addresses are bracketed",
			pool: testPool(8000),
			pods: []corev1.Pod{testPod("a", "fd00::1")},
			want: []sched.Endpoint{ep("[fd00::1]:8000", 100, false)},
		},
		{
			name: "the engine-type label names the endpoint's engine",
			pool: testPool(8000),
			pods: []corev1.Pod{testPod("a", "10.0.0.1", label(LabelEngineType, "sglang")), testPod("b", "10.0.0.2")},
			want: []sched.Endpoint{
				{Addr: "10.0.0.1:8000", MaxBatchedTokens: 100, Engine: "sglang"},
				ep("10.0.0.2:8000", 100, false),
			},
		},
		{
			name: "the role label puts a pod in the prefill or decode set; unknown roles serve whole requests",
			pool: testPool(8000),
			pods: []corev1.Pod{
				testPod("a", "10.0.0.1", label(DefaultRoleLabel, "prefill")),
				testPod("b", "10.0.0.2", label(DefaultRoleLabel, "decode")),
				testPod("c", "10.0.0.3", label(DefaultRoleLabel, "both")),
				testPod("d", "10.0.0.4", label(DefaultRoleLabel, "prefil")),
				testPod("e", "10.0.0.5", label("example.com/role", "prefill")),
			},
			want: []sched.Endpoint{
				{Addr: "10.0.0.1:8000", MaxBatchedTokens: 100, Role: sched.RolePrefill},
				{Addr: "10.0.0.2:8000", MaxBatchedTokens: 100, Role: sched.RoleDecode},
				ep("10.0.0.3:8000", 100, false),
				ep("10.0.0.4:8000", 100, false),
				ep("10.0.0.5:8000", 100, false),
			},
			wantBad: []string{`d: label llm-d.ai/role: unknown role "prefil"`},
		},
		{
			name: "a port listed twice is one endpoint",
			pool: testPool(8000, 8000),
			pods: []corev1.Pod{testPod("a", "10.0.0.1")},
			want: []sched.Endpoint{ep("10.0.0.1:8000", 100, false)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var bad []string
			report := func(pod string, err error) { bad = append(bad, pod+": "+err.Error()) }
			got := Endpoints(tt.pool, tt.pods, 100, DefaultRoleLabel, report, report)
			if !slices.Equal(got, tt.want) {
				t.Errorf("Endpoints:\n got %+v\nwant %+v", got, tt.want)
			}
			if len(bad) != len(tt.wantBad) {
				t.Fatalf("reported %d problems %q, want %d", len(bad), bad, len(tt.wantBad))
			}
			for i, w := range tt.wantBad {
				if !strings.Contains(bad[i], w) {
					t.Errorf("problem %d = %q, want it to contain %q", i, bad[i], w)
				}
			}
		})
	}
}

func TestPoolSelectorEmptySelectsNothing(t *testing.T) {
	p := testPool(8000)
	p.Spec.Selector.MatchLabels = nil
	if s := poolSelector(p); s != nil {
		t.Fatalf("empty matchLabels gave selector %v, want none (select no pod)", s)
	}
	if s := poolSelector(testPool(8000)); s == nil || s.String() != "app=llm" {
		t.Fatalf("selector = %v, want app=llm", s)
	}
}

func TestPoolObjects(t *testing.T) {
	pool := PoolRef{Group: v1alpha1.DefaultPoolGroup}
	pool.Namespace, pool.Name = "ns", "p"
	class := func(name, group, poolName string) v1alpha1.PolicyClass {
		c := v1alpha1.PolicyClass{ObjectMeta: metav1.ObjectMeta{Name: name}}
		c.Spec.PoolRef = v1alpha1.PoolReference{Group: group, Name: poolName}
		return c
	}
	prof := func(name, poolName string) v1alpha1.PolicyProfile {
		p := v1alpha1.PolicyProfile{ObjectMeta: metav1.ObjectMeta{Name: name}}
		p.Spec.PoolRef = v1alpha1.PoolReference{Name: poolName}
		return p
	}
	ps, cs := PoolObjects(pool,
		[]v1alpha1.PolicyProfile{prof("mine", "p"), prof("other", "q")},
		[]v1alpha1.PolicyClass{
			class("explicit-group", v1alpha1.DefaultPoolGroup, "p"),
			class("empty-group", "", "p"),
			class("other-pool", "", "q"),
			class("other-group", "inference.networking.x-k8s.io", "p"),
		})
	var names []string
	for _, p := range ps {
		names = append(names, "profile/"+p.Name)
	}
	for _, c := range cs {
		names = append(names, "class/"+c.Name)
	}
	want := []string{"profile/mine", "class/explicit-group", "class/empty-group"}
	if !slices.Equal(names, want) {
		t.Fatalf("PoolObjects = %q, want %q", names, want)
	}
}
