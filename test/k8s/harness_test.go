package k8s

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	"sigs.k8s.io/yaml"

	"github.com/laneway-dev/laneway/api/v1alpha1"
	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/internal/testbed/testenv"
	"github.com/laneway-dev/laneway/pkg/policy"
)

// stopGrace is how long a picker may drain after SIGTERM (its
// --drain-timeout is 5 s) before it counts as stuck.
const stopGrace = 15 * time.Second

// classHeader is Laneway's own policy-class request header (SPEC §6).
const classHeader = "x-laneway-policy-class"

// env is one test's namespace: the picker's RBAC from config/rbac applied
// to it, and a kubeconfig authenticated as its ServiceAccount.
type env struct {
	t          *testing.T
	ns         string
	kubeconfig string
	port       int // the pools' target port, free on the test's loopback IPs
}

// newEnv creates a namespace with the ServiceAccount, and unless noRole
// also the Role and RoleBinding, of config/rbac.
func newEnv(t *testing.T, noRole bool) *env {
	t.Helper()
	requireEnv(t)
	port, err := launch.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ns: "lw-" + rand.String(6), port: port}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}}
	if err := admin.Create(ctx(t), ns); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	// envtest runs no namespace controller, so a deleted namespace's
	// objects stay; each test's names are its own anyway.
	t.Cleanup(func() { _ = admin.Delete(context.Background(), ns) })
	sa := &corev1.ServiceAccount{}
	e.readRBAC("service_account.yaml", sa)
	e.create(sa)
	if !noRole {
		e.applyRole()
	}
	e.kubeconfig = e.saKubeconfig(sa.Name)
	return e
}

// applyRole creates the committed Role and RoleBinding in the namespace, as
// a kustomize overlay setting `namespace:` would.
func (e *env) applyRole() {
	role := &rbacv1.Role{}
	e.readRBAC("role.yaml", role)
	rb := &rbacv1.RoleBinding{}
	e.readRBAC("role_binding.yaml", rb)
	for i := range rb.Subjects {
		if rb.Subjects[i].Kind == rbacv1.ServiceAccountKind {
			rb.Subjects[i].Namespace = e.ns
		}
	}
	e.create(role)
	e.create(rb)
}

// readRBAC reads one manifest of config/rbac into obj, in e's namespace.
func (e *env) readRBAC(name string, obj client.Object) {
	e.t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		e.t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "config", "rbac", name))
	if err != nil {
		e.t.Fatalf("read config/rbac/%s: %v", name, err)
	}
	data = bytes.TrimPrefix(bytes.TrimSpace(data), []byte("---\n"))
	if err := yaml.UnmarshalStrict(data, obj); err != nil {
		e.t.Fatalf("parse config/rbac/%s: %v", name, err)
	}
	obj.SetNamespace(e.ns)
}

func (e *env) create(obj client.Object) {
	e.t.Helper()
	obj.SetNamespace(e.ns)
	if err := admin.Create(ctx(e.t), obj); err != nil {
		e.t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

// saKubeconfig writes a kubeconfig holding a TokenRequest token of the
// ServiceAccount, so the picker runs with exactly the Role's rights.
func (e *env) saKubeconfig(sa string) string {
	e.t.Helper()
	path := filepath.Join(e.t.TempDir(), "kubeconfig")
	if _, err := testenv.ServiceAccountKubeconfig(ctx(e.t), adminCfg, e.ns, sa, path); err != nil {
		e.t.Fatal(err)
	}
	return path
}

// createPool creates an InferencePool selecting app=<app> on e.port (and
// any extra ports).
func (e *env) createPool(name, app string, extraPorts ...int) *inferencev1.InferencePool {
	e.t.Helper()
	p := &inferencev1.InferencePool{ObjectMeta: metav1.ObjectMeta{Name: name}}
	p.Spec.Selector.MatchLabels = map[inferencev1.LabelKey]inferencev1.LabelValue{"app": inferencev1.LabelValue(app)}
	for _, port := range append([]int{e.port}, extraPorts...) {
		p.Spec.TargetPorts = append(p.Spec.TargetPorts, inferencev1.Port{Number: inferencev1.PortNumber(port)})
	}
	p.Spec.EndpointPickerRef = &inferencev1.EndpointPickerRef{Name: "laneway-epp", Port: &inferencev1.Port{Number: 9002}}
	e.create(p)
	return p
}

// nextIP hands out loopback addresses unlikely to collide with other
// suites' 127.0.0.x servers.
var nextIP atomic.Int32

func newIP() string {
	n := nextIP.Add(1)
	return fmt.Sprintf("127.86.%d.%d", n/250, n%250+1)
}

// pod is a model-server pod of the test: its object and the real HTTP
// server listening on its IP.
type pod struct {
	name string
	ip   string
}

// addr is the pod's endpoint on port.
func (p pod) addr(port int) string { return net.JoinHostPort(p.ip, strconv.Itoa(port)) }

// podSpec describes a pod to create.
type podSpec struct {
	app         string
	ready       bool
	annotations map[string]string
	finalizers  []string
	ports       []int // HTTP servers to start; default e.port
	// ip, when set, is the pod's address, where the test serves the
	// model server itself: no HTTP server is started for it.
	ip string
}

// addPod starts the pod's HTTP servers and creates the pod with its status
// (IP, Running, Ready condition) written through the status subresource,
// as a kubelet would.
func (e *env) addPod(name string, s podSpec) pod {
	e.t.Helper()
	p := pod{name: name, ip: s.ip}
	if p.ip == "" {
		p.ip = newIP()
		ports := s.ports
		if len(ports) == 0 {
			ports = []int{e.port}
		}
		for _, port := range ports {
			startBackend(e.t, p.addr(port))
		}
	}
	obj := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": s.app}, Annotations: s.annotations, Finalizers: s.finalizers},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "model-server", Image: "laneway.dev/none"}}},
	}
	e.create(obj)
	obj.Status = corev1.PodStatus{
		Phase:  corev1.PodRunning,
		PodIP:  p.ip,
		PodIPs: []corev1.PodIP{{IP: p.ip}},
	}
	obj.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: readyStatus(s.ready), LastTransitionTime: metav1.Now()}}
	if err := admin.Status().Update(ctx(e.t), obj); err != nil {
		e.t.Fatalf("write status of pod %s: %v", name, err)
	}
	return p
}

func readyStatus(ready bool) corev1.ConditionStatus {
	if ready {
		return corev1.ConditionTrue
	}
	return corev1.ConditionFalse
}

// updatePod applies change to the pod (status too when status is set),
// retrying on conflicts, and returns when the API server has the change.
func (e *env) updatePod(name string, status bool, change func(*corev1.Pod)) {
	e.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var p corev1.Pod
		if err := admin.Get(ctx(e.t), client.ObjectKey{Namespace: e.ns, Name: name}, &p); err != nil {
			return err
		}
		change(&p)
		if status {
			return admin.Status().Update(ctx(e.t), &p)
		}
		return admin.Update(ctx(e.t), &p)
	})
	if err != nil {
		e.t.Fatalf("update pod %s: %v", name, err)
	}
}

func (e *env) setReady(name string, ready bool) {
	e.updatePod(name, true, func(p *corev1.Pod) {
		p.Status.Conditions[0].Status = readyStatus(ready)
		p.Status.Conditions[0].LastTransitionTime = metav1.Now()
	})
}

func (e *env) deletePod(name string) {
	e.t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}}
	if err := admin.Delete(ctx(e.t), p); err != nil {
		e.t.Fatalf("delete pod %s: %v", name, err)
	}
}

// startBackend serves a minimal OpenAI-style completion on addr until the
// test ends.
func startBackend(t *testing.T, addr string) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("backend listen on %s: %v", addr, err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("content-type", "application/json")
			w.Header().Set("x-served-by", addr)
			_, _ = io.WriteString(w, `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"ok"}]}`)
		}),
		ReadHeaderTimeout: 5 * time.Second,
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// ctx is a bounded context for one API call or wait of the test.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), launch.EventTimeout)
	t.Cleanup(cancel)
	return c
}

// eppProc is a running picker process with the connections the tests
// use.
type eppProc struct {
	*launch.EPP
	t          *testing.T
	healthConn *grpc.ClientConn
	client     *extprocclient.Client
}

// startEPP starts the picker in Kubernetes mode for pool, on ports chosen
// by the kernel, and returns once it listens (not yet ready: see
// waitReady). At cleanup a live picker gets SIGTERM and must exit 0.
func (e *env) startEPP(name, pool string, args ...string) *eppProc {
	e.t.Helper()
	return e.startEPPEnv(name, pool, nil, args...)
}

// startEPPEnv is startEPP with further environment variables.
func (e *env) startEPPEnv(name, pool string, extraEnv []string, args ...string) *eppProc {
	e.t.Helper()
	// Only the kubeconfig flag may say where the API server is.
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "KUBECONFIG=") || strings.HasPrefix(kv, "POD_NAMESPACE=") || strings.HasPrefix(kv, "KUBERNETES_SERVICE_") ||
			strings.HasPrefix(kv, "POD_IP=")
	})
	env = append(env, extraEnv...)
	p := bins.RunEPP(e.t, launch.EPPOptions{
		SkipReady: true,
		Args: append([]string{
			"--pool-name=" + pool,
			"--pool-namespace=" + e.ns,
			"--kubeconfig=" + e.kubeconfig,
			"--drain-timeout=5s",
			"--status-interval=200ms",
			// The pods' addresses serve no model-server /metrics here: with
			// scraping on every pod would stay busy (unknown load).
			"--scrape-metrics=false",
		}, args...),
		Proc: launch.ProcOptions{Name: name, Env: env, StopGrace: stopGrace},
	})
	return &eppProc{EPP: p, t: e.t, healthConn: p.HealthConn(e.t), client: p.Client(e.t, extprocclient.Options{})}
}

// watchReadiness streams the readiness health status into the returned
// channel (each change once) until the test ends.
func (p *eppProc) watchReadiness() <-chan healthpb.HealthCheckResponse_ServingStatus {
	ch := make(chan healthpb.HealthCheckResponse_ServingStatus, 16)
	c, cancel := context.WithCancel(context.Background())
	p.t.Cleanup(cancel)
	stream, err := healthpb.NewHealthClient(p.healthConn).Watch(c, &healthpb.HealthCheckRequest{Service: "readiness"}, grpc.WaitForReady(true))
	if err != nil {
		p.t.Fatalf("%s: watch readiness: %v", p.Name, err)
	}
	go func() {
		defer close(ch)
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			ch <- m.GetStatus()
		}
	}()
	return ch
}

// waitStatus reads statuses from ch until want, and returns when it came.
func (p *eppProc) waitStatus(ch <-chan healthpb.HealthCheckResponse_ServingStatus, want healthpb.HealthCheckResponse_ServingStatus, limit time.Duration) time.Time {
	p.t.Helper()
	deadline := time.After(limit)
	last := healthpb.HealthCheckResponse_UNKNOWN
	for {
		select {
		case st, ok := <-ch:
			if !ok {
				p.t.Fatalf("%s: readiness stream ended at %v, waiting for %v\n%s", p.Name, last, want, p.Log.Tail(64<<10))
			}
			last = st
			if st == want {
				return time.Now()
			}
		case <-deadline:
			p.t.Fatalf("%s: readiness %v, not %v, after %s\n%s", p.Name, last, want, limit, p.Log.Tail(64<<10))
		}
	}
}

// waitReady waits for readiness SERVING.
func (p *eppProc) waitReady() {
	p.t.Helper()
	p.waitStatus(p.watchReadiness(), healthpb.HealthCheckResponse_SERVING, launch.DefaultReadyTimeout)
}

// request builds a completion request, optionally with a class and a
// subset hint.
func request(class string, subset ...string) extprocclient.RequestSpec {
	s := extprocclient.RequestSpec{
		Path:    "/v1/completions",
		Headers: http.Header{"content-type": {"application/json"}},
		Body:    []byte(`{"model":"m","prompt":"the quick brown fox jumps over the lazy dog","max_tokens":1}`),
	}
	if class != "" {
		s.Headers.Set(classHeader, class)
	}
	if subset != nil {
		s.Subset = &extprocclient.SubsetHint{Endpoints: subset}
	}
	return s
}

// start opens an exchange and waits for the picker's decision.
func (p *eppProc) start(c context.Context, spec extprocclient.RequestSpec) *extprocclient.Exchange {
	p.t.Helper()
	ex, err := p.client.Start(c, spec)
	if err != nil {
		p.t.Fatalf("%s: ext_proc exchange: %v", p.Name, err)
	}
	return ex
}

// routed requires a routed decision and returns the picked endpoint.
func routed(t *testing.T, ex *extprocclient.Exchange) string {
	t.Helper()
	d := ex.Decision()
	if !d.Routed() {
		t.Fatalf("request answered %d (%s) %s, want routed", d.Immediate.Status, d.Immediate.Headers.Get("x-laneway-reason"), d.Immediate.Body)
	}
	if len(d.Endpoints) == 0 {
		t.Fatal("routed decision without an endpoint")
	}
	return d.Endpoints[0]
}

// serve plays the gateway: the request goes to the picked endpoint's real
// server and its answer back through the picker's response phases.
func serve(t *testing.T, ex *extprocclient.Exchange) {
	t.Helper()
	defer ex.Close()
	target := routed(t, ex)
	resp, err := http.Post("http://"+target+"/v1/completions", "application/json", bytes.NewReader(ex.Decision().Body))
	if err != nil {
		t.Fatalf("upstream %s: %v", target, err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("upstream %s body: %v", target, err)
	}
	if got := resp.Header.Get("x-served-by"); got != target {
		t.Fatalf("upstream answered as %q, want %q", got, target)
	}
	if _, _, err := ex.Respond(resp.StatusCode, http.Header{"content-type": {"application/json"}}, body); err != nil {
		t.Fatalf("response phases: %v", err)
	}
}

// endpoints is the picker's current endpoint set (one gauge series each).
func (p *eppProc) endpoints() []string {
	p.t.Helper()
	return p.Metrics.Read(p.t).LabelValues("laneway_endpoint_active_prefill_tokens", "endpoint")
}

// waitEndpoints polls the metrics (the picker has no event to watch) until
// the endpoint set is want, and returns the time since since. It fails the
// test after limit.
func (p *eppProc) waitEndpoints(since time.Time, limit time.Duration, want ...string) time.Duration {
	p.t.Helper()
	want = slices.Sorted(slices.Values(want))
	var got []string
	launch.WaitWithin(p.t, time.Until(since.Add(limit)),
		func() string { return fmt.Sprintf("%s: endpoints %q after %s, want %q", p.Name, got, limit, want) },
		func() bool {
			got = p.endpoints()
			return slices.Equal(got, want)
		})
	return time.Since(since)
}

// policyClass builds an explicit fcfs class of pool; threshold nil never
// queues (prefillBusyThreshold none: these suites run without engine
// metrics, so the auto default is not what they test).
func policyClass(name, pool string, quantum int64, threshold *int64) *v1alpha1.PolicyClass {
	t := intstr.FromString(policy.BusyNone)
	if threshold != nil {
		t = intstr.FromInt32(int32(*threshold))
	}
	return &v1alpha1.PolicyClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.PolicyClassSpec{
			PoolRef:              v1alpha1.PoolReference{Name: pool},
			QueuePolicy:          v1alpha1.QueuePolicyFCFS,
			Quantum:              quantum,
			PrefillBusyThreshold: &t,
		},
	}
}

// waitClass watches the PolicyClass until cond holds and returns it.
func (e *env) waitClass(name string, what string, cond func(*v1alpha1.PolicyClass) bool) *v1alpha1.PolicyClass {
	e.t.Helper()
	return waitObject(e, &v1alpha1.PolicyClassList{}, name, what, cond)
}

// waitProfile watches the PolicyProfile until cond holds and returns it.
func (e *env) waitProfile(name string, what string, cond func(*v1alpha1.PolicyProfile) bool) *v1alpha1.PolicyProfile {
	e.t.Helper()
	return waitObject(e, &v1alpha1.PolicyProfileList{}, name, what, cond)
}

// waitObject lists and then watches list's kind in e's namespace until the
// object called name satisfies cond.
func waitObject[T client.Object](e *env, list client.ObjectList, name, what string, cond func(T) bool) T {
	e.t.Helper()
	return waitObjectFor(e, launch.EventTimeout, list, name, what, cond)
}

// waitObjectFor is waitObject failing after timeout, for a wait whose
// bound is the assertion.
func waitObjectFor[T client.Object](e *env, timeout time.Duration, list client.ObjectList, name, what string, cond func(T) bool) T {
	e.t.Helper()
	wc, err := client.NewWithWatch(adminCfg, client.Options{Scheme: admin.Scheme()})
	if err != nil {
		e.t.Fatal(err)
	}
	c, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := wc.List(c, list, client.InNamespace(e.ns)); err != nil {
		e.t.Fatalf("list %T: %v", list, err)
	}
	items, err := apimeta.ExtractList(list)
	if err != nil {
		e.t.Fatal(err)
	}
	var last T
	for _, it := range items {
		if o, ok := it.(T); ok && o.GetName() == name {
			last = o
			if cond(o) {
				return o
			}
		}
	}
	w, err := wc.Watch(c, list, client.InNamespace(e.ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.GetResourceVersion()}})
	if err != nil {
		e.t.Fatalf("watch %T: %v", list, err)
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if o, ok := ev.Object.(T); ok && o.GetName() == name {
			last = o
			if cond(o) {
				return o
			}
		}
	}
	e.t.Fatalf("%T %s: not %s within %s; last seen %+v", last, name, what, timeout, last)
	return last
}

// accepted returns a condition check: Accepted has status st and reason,
// for the object's current generation.
func accepted(st metav1.ConditionStatus, reason string) func(*v1alpha1.PolicyClass) bool {
	return func(pc *v1alpha1.PolicyClass) bool {
		return isAccepted(pc.Status.Conditions, pc.Status.ObservedGeneration, pc.Generation, st, reason)
	}
}

// profileAccepted is accepted for a PolicyProfile.
func profileAccepted(st metav1.ConditionStatus, reason string) func(*v1alpha1.PolicyProfile) bool {
	return func(pp *v1alpha1.PolicyProfile) bool {
		return isAccepted(pp.Status.Conditions, pp.Status.ObservedGeneration, pp.Generation, st, reason)
	}
}

func isAccepted(conds []metav1.Condition, observed, gen int64, st metav1.ConditionStatus, reason string) bool {
	c := apimeta.FindStatusCondition(conds, v1alpha1.ConditionAccepted)
	return c != nil && c.Status == st && c.Reason == reason && c.ObservedGeneration == gen && observed == gen
}

// acceptedCondition returns the class's Accepted condition.
func acceptedCondition(pc *v1alpha1.PolicyClass) metav1.Condition {
	for _, c := range pc.Status.Conditions {
		if c.Type == v1alpha1.ConditionAccepted {
			return c
		}
	}
	return metav1.Condition{}
}
