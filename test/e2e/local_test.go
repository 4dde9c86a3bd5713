package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/internal/testbed/testenv"
)

// Bounds of the local environment's waits: failure guards for events that
// come much sooner, not performance assertions.
const (
	startTimeout = 60 * time.Second
	// eppDrain is the picker's --drain-timeout here (the chart's default
	// of 30 s would only slow a failing run down).
	eppDrain = 10 * time.Second
)

// localCluster is the local environment: a real kube-apiserver, the
// picker as a process with the chart's ServiceAccount token, model
// servers as processes on their own loopback addresses, and the
// in-process local gateway.
type localCluster struct {
	cfg   *rest.Config
	kube  client.Client
	apply *applier
	bins  launch.Binaries
}

func newLocalCluster(t *testing.T) *localCluster {
	cfg := apiServer(t)
	a, err := newApplier(cfg)
	if err != nil {
		t.Fatal(err)
	}
	scheme, err := testenv.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	kube, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return &localCluster{cfg: cfg, kube: kube, apply: a, bins: binaries(t)}
}

// nextIP hands out loopback addresses in 127.88.0.0/16, a range no other
// suite of the module uses (they may run at the same time), one per pod
// for the whole binary, so a stopped pod's address is never reused.
var nextIP atomic.Int32

func allocIP() (string, error) {
	n := nextIP.Add(1)
	if n >= 250*250 {
		return "", errors.New("out of loopback addresses for pods")
	}
	return fmt.Sprintf("127.88.%d.%d", n/250, n%250+1), nil
}

// localValues are the chart values every local release gets: the chart
// creates the pool (and the InferencePool CRD, which the bare API server
// lacks) selecting this release's model servers.
func localValues(port int) string {
	return fmt.Sprintf(`
epp:
  drainTimeoutSeconds: %d
  conformanceHooks: true # the scenarios pin requests with the conformance header
# The scenarios send class and priority hints straight to the picker (no
# gateway in front strips them) and test what the picker does with them.
trustClientHints: true
inferencePool:
  name: pool
  create: true
  installCRD: true
  selector:
    app: modelsim
  targetPorts: [%d]
`, int(eppDrain.Seconds()), port)
}

// localRelease is a release's local processes.
type localRelease struct {
	c *localCluster
	r *release

	mu   sync.Mutex
	epp  *launch.EPP
	sims map[string]*launch.Sim
}

func (c *localCluster) install(t *testing.T, spec installSpec) *release {
	t.Helper()
	ctx := testContext(t, startTimeout)
	ns := "e2e-" + spec.name
	if err := c.apply.ensureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}

	// Pod addresses and the pool's target port.
	ips := make([]string, len(spec.pods))
	for i := range spec.pods {
		ip, err := allocIP()
		if err != nil {
			t.Fatal(err)
		}
		ips[i] = ip
	}
	port, err := launch.FreePortOnAll(ips)
	if err != nil {
		t.Fatal(err)
	}

	// The chart, rendered and applied as is.
	objs := render(t, renderArgs{release: spec.name, namespace: ns, values: localValues(port) + "\n" + spec.values})
	if err := c.apply.apply(ctx, objs); err != nil {
		t.Fatal(err)
	}
	dep := findObject(objs, "Deployment", "")
	for _, o := range objs {
		if o.GetKind() == "Deployment" && o.GetLabels()["app.kubernetes.io/component"] == "endpoint-picker" {
			dep = o
		}
	}
	if dep == nil {
		t.Fatalf("the chart rendered no picker Deployment: %v", kinds(objs))
	}

	lr := &localRelease{c: c, sims: map[string]*launch.Sim{}}
	r := &release{t: t, ns: ns, pool: "pool", kube: c.kube, pods: map[string]*simPod{}, ops: lr, http: newHTTPClient()}
	lr.r = r

	// Model servers first, then their pod objects, so a Ready pod always
	// has a live server behind it.
	for i, ps := range spec.pods {
		s := c.bins.RunSim(t, launch.SimOptions{
			Host: ips[i],
			Port: port,
			Args: append([]string{"--instance=" + ps.name, "--model=sim-model"}, simArgs...),
			Proc: launch.ProcOptions{Name: "modelsim " + ps.name, ReadyTimeout: startTimeout, StopGrace: 15 * time.Second},
		})
		lr.mu.Lock()
		lr.sims[ps.name] = s
		lr.mu.Unlock()
		r.pods[ps.name] = &simPod{name: ps.name, addr: s.Addr}
		if err := c.createPod(ctx, ns, ps, ips[i]); err != nil {
			t.Fatal(err)
		}
	}

	// The picker, with the Deployment's own flags and the chart's
	// ServiceAccount's identity.
	sa := dep.Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["serviceAccountName"].(string)
	kubeconfig, err := c.serviceAccountKubeconfig(ctx, t, ns, sa)
	if err != nil {
		t.Fatal(err)
	}
	args, secure, err := localEPPArgs(dep, kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	lr.epp = c.bins.RunEPP(t, launch.EPPOptions{
		TLS:  secure,
		Args: args,
		Proc: launch.ProcOptions{
			Name:         "epp",
			Env:          append(os.Environ(), "POD_NAMESPACE="+ns, "POD_NAME="+spec.name+"-epp-0"),
			ReadyTimeout: startTimeout,
			StopGrace:    eppDrain + 10*time.Second,
		},
	})

	// The local gateway in place of Envoy.
	r.url = c.bins.RunGateway(t, launch.GatewayOptions{EPP: lr.epp, Timeout: 3 * time.Minute}).URL

	if err := waitPodsRouted(ctx, r, spec.pods); err != nil {
		t.Fatalf("%v\npicker log:\n%s", err, lr.diagnostics())
	}
	return r
}

// localEPPArgs turns the chart's picker container args into a local
// command line: the same flags, less the ports (the launcher has the
// kernel choose free loopback ones), with the ServiceAccount kubeconfig.
// It reports whether the picker serves TLS.
func localEPPArgs(dep *unstructured.Unstructured, kubeconfig string) ([]string, bool, error) {
	containers, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	if len(containers) != 1 {
		return nil, false, fmt.Errorf("picker Deployment has %d containers", len(containers))
	}
	raw, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
	ports := map[string]bool{"--grpc-port": true, "--grpc-health-port": true, "--metrics-port": true, "--status-port": true}
	secure := true
	var args []string
	for _, a := range raw {
		name, val, _ := strings.Cut(a, "=")
		if ports[name] {
			delete(ports, name)
			continue
		}
		if name == "--secure-serving" {
			secure = val != "false"
		}
		args = append(args, a)
	}
	if len(ports) > 0 {
		return nil, false, fmt.Errorf("chart args %v lack %v", raw, slices.Sorted(maps.Keys(ports)))
	}
	return append(args, "--kubeconfig="+kubeconfig), secure, nil
}

// serviceAccountKubeconfig writes a kubeconfig holding a TokenRequest
// token of the chart's ServiceAccount: the picker then has exactly the
// chart's Role, as in a cluster. It checks that the identity cannot read
// Secrets, so a test never passes on an over-broad identity.
func (c *localCluster) serviceAccountKubeconfig(ctx context.Context, t *testing.T, ns, sa string) (string, error) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	saCfg, err := testenv.ServiceAccountKubeconfig(ctx, c.cfg, ns, sa, path)
	if err != nil {
		return "", err
	}
	saCS, err := kubernetes.NewForConfig(saCfg)
	if err != nil {
		return "", err
	}
	if _, err := saCS.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err != nil {
		return "", fmt.Errorf("the chart's ServiceAccount cannot list pods (its Role should allow it): %w", err)
	}
	if _, err := saCS.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		return "", fmt.Errorf("the chart's ServiceAccount listing Secrets: %v, want Forbidden (least privilege)", err)
	}
	return path, nil
}

// podNode is the node the local pods claim. No kubelet runs, so a
// graceful deletion leaves the pod terminating (deletionTimestamp set)
// until the test removes it, as a kubelet would after the grace period.
const podNode = "e2e-node"

// createPod creates the pod object of a model server and sets its status
// as a kubelet would: Running, the server's address, Ready or not.
func (c *localCluster) createPod(ctx context.Context, ns string, ps podSpec, ip string) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: ps.name, Namespace: ns, Labels: map[string]string{"app": "modelsim"}},
		Spec: corev1.PodSpec{
			NodeName:   podNode,
			Containers: []corev1.Container{{Name: "modelsim", Image: "laneway-modelsim:e2e", Ports: []corev1.ContainerPort{{ContainerPort: 8000}}}},
		},
	}
	if err := c.kube.Create(ctx, pod); err != nil {
		return fmt.Errorf("create pod %s: %w", ps.name, err)
	}
	ready := corev1.ConditionTrue
	if ps.notReady {
		ready = corev1.ConditionFalse
	}
	now := metav1.Now()
	pod.Status = corev1.PodStatus{
		Phase:     corev1.PodRunning,
		PodIP:     ip,
		PodIPs:    []corev1.PodIP{{IP: ip}},
		HostIP:    "127.0.0.1",
		StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: ready, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: ready, LastTransitionTime: now},
		},
	}
	if err := c.kube.Status().Update(ctx, pod); err != nil {
		return fmt.Errorf("set status of pod %s: %w", ps.name, err)
	}
	return nil
}

func (lr *localRelease) diagnostics() string {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	if lr.epp == nil {
		return "(no picker)"
	}
	return lr.epp.Log.Tail(20000)
}

func (lr *localRelease) pickerMetrics(ctx context.Context) ([]byte, error) {
	lr.mu.Lock()
	page := lr.epp.Metrics
	lr.mu.Unlock()
	return httpGet(ctx, string(page))
}

func (lr *localRelease) beginPodDeletion(ctx context.Context, name string) error {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: lr.r.ns}}
	if err := lr.c.kube.Delete(ctx, pod, client.GracePeriodSeconds(30)); err != nil {
		return fmt.Errorf("delete pod %s: %w", name, err)
	}
	if err := lr.c.kube.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil || pod.DeletionTimestamp == nil {
		return fmt.Errorf("pod %s after a graceful delete: %v, deletionTimestamp %v; want it terminating", name, err, pod.DeletionTimestamp)
	}
	return nil
}

func (lr *localRelease) finishPodDeletion(ctx context.Context, name string) error {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: lr.r.ns}}
	if err := lr.c.kube.Delete(ctx, pod, client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove pod %s: %w", name, err)
	}
	// The picker has dropped the endpoint when a request pinned to it is
	// answered 503 no_endpoints at once.
	addr := lr.r.pods[name].addr
	var last answer
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		last = lr.r.send(ctx, request{strict: -1, pin: addr, promptTokens: 8})
		return last.status == http.StatusServiceUnavailable && last.reason == "no_endpoints", nil
	})
	if err != nil {
		return fmt.Errorf("the picker still routes to removed pod %s (last answer %v): %w", name, last, err)
	}
	lr.mu.Lock()
	s := lr.sims[name]
	delete(lr.sims, name)
	lr.mu.Unlock()
	// SIGTERM, as a kubelet sends: the server finishes what it has.
	return s.Stop(15 * time.Second)
}

// restartPicker stops the picker and starts it again on the same ports,
// where the gateway's connection finds it.
func (lr *localRelease) restartPicker(ctx context.Context) error {
	lr.mu.Lock()
	old := lr.epp
	lr.mu.Unlock()
	p, err := old.Restart(ctx)
	if err != nil {
		return fmt.Errorf("picker: %w", err)
	}
	lr.mu.Lock()
	lr.epp = p
	lr.mu.Unlock()
	return nil
}

// httpGet returns the body of a 200 answer from url.
func httpGet(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return body, err
}

// waitPodsRouted waits until a request pinned to each Ready pod is served
// by it, and one pinned to a pod that is not Ready is refused: the
// picker's endpoint set then matches the pods. The picker answers pinned
// requests at once, so this polls only across the watch's propagation.
func waitPodsRouted(ctx context.Context, r *release, pods []podSpec) error {
	for _, ps := range pods {
		addr := r.pods[ps.name].addr
		var last answer
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, startTimeout, true, func(ctx context.Context) (bool, error) {
			last = r.send(ctx, request{strict: -1, pin: addr, promptTokens: 8})
			if ps.notReady {
				return last.status == http.StatusServiceUnavailable && last.reason == "no_endpoints", nil
			}
			return last.status == http.StatusOK && last.served == ps.name, nil
		})
		if err != nil {
			return fmt.Errorf("pod %s (%s, notReady=%v): picker's routing does not match (last answer %v): %w", ps.name, addr, ps.notReady, last, err)
		}
	}
	return nil
}
