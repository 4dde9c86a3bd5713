package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/internal/testbed/testenv"
)

// The kind environment's settings, from the environment:
//
//	DOCKER, KIND          the docker and kind commands (default: from PATH)
//	E2E_KIND_CLUSTER      cluster name (default laneway-e2e); an existing
//	                      cluster of that name is reused and kept
//	E2E_KIND_KEEP=1       keep a cluster this run created
const (
	kindDefaultCluster = "laneway-e2e"
	eppImage           = "laneway-epp:e2e"
	simImage           = "laneway-modelsim:e2e"
	kindTimeout        = 5 * time.Minute
)

// kindCluster is the kind environment: the chart installed with its Envoy
// data plane, modelsim pods from the image, requests through a
// port-forward to Envoy.
type kindCluster struct {
	name       string
	kubeconfig string
	cfg        *rest.Config
	kube       client.Client
	cs         *kubernetes.Clientset
	apply      *applier
}

var kindShared struct {
	once    sync.Once
	c       *kindCluster
	skip    string
	err     error
	cleanup func()
}

// kindTools finds docker and kind and checks that a Docker engine
// answers; the returned reason is the one-line skip message.
func kindTools() (docker, kind, skip string) {
	docker, kind = os.Getenv("DOCKER"), os.Getenv("KIND")
	if docker == "" {
		docker = "docker"
	}
	if kind == "" {
		kind = "kind"
	}
	var err error
	if docker, err = exec.LookPath(docker); err != nil {
		return "", "", "kind e2e: docker not found in PATH"
	}
	if kind, err = exec.LookPath(kind); err != nil {
		return "", "", "kind e2e: kind not found in PATH"
	}
	if out, err := exec.Command(docker, "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
		return "", "", "kind e2e: no Docker engine (" + line + ")"
	}
	return docker, kind, ""
}

// run runs a command with its output kept for the error.
func run(ctx context.Context, dir, bin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w\n%s", filepath.Base(bin), strings.Join(args, " "), err, launch.Tail(out.String(), 4000))
	}
	return out.String(), nil
}

func newKindCluster(t *testing.T) *kindCluster {
	t.Helper()
	kindShared.once.Do(func() {
		docker, kind, skip := kindTools()
		if skip != "" {
			kindShared.skip = skip
			return
		}
		kindShared.c, kindShared.err = setUpKind(docker, kind)
	})
	if kindShared.skip != "" {
		t.Skip(kindShared.skip)
	}
	if kindShared.err != nil {
		t.Fatal(kindShared.err)
	}
	return kindShared.c
}

// setUpKind creates (or reuses) the cluster, builds and loads the images,
// and installs the upstream InferencePool CRD once (each release then
// leaves inferencePool.installCRD off, as on a cluster whose gateway
// brought it).
func setUpKind(docker, kind string) (*kindCluster, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	name := os.Getenv("E2E_KIND_CLUSTER")
	if name == "" {
		name = kindDefaultCluster
	}
	out, err := run(ctx, "", kind, "get", "clusters")
	if err != nil {
		return nil, err
	}
	exists := false
	for _, l := range strings.Fields(out) {
		exists = exists || l == name
	}
	if !exists {
		if _, err := run(ctx, "", kind, "create", "cluster", "--name", name, "--wait", "3m"); err != nil {
			return nil, err
		}
		if os.Getenv("E2E_KIND_KEEP") != "1" {
			kindShared.cleanup = func() {
				dctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				if _, err := run(dctx, "", kind, "delete", "cluster", "--name", name); err != nil {
					fmt.Fprintln(os.Stderr, "e2e:", err)
				}
			}
		}
	}
	for _, img := range []struct{ file, tag string }{{"build/epp.Dockerfile", eppImage}, {"build/modelsim.Dockerfile", simImage}} {
		if _, err := run(ctx, shared.root, docker, "build", "-f", img.file, "-t", img.tag, "."); err != nil {
			return nil, err
		}
	}
	if _, err := run(ctx, "", kind, "load", "docker-image", eppImage, simImage, "--name", name); err != nil {
		return nil, err
	}
	kc, err := run(ctx, "", kind, "get", "kubeconfig", "--name", name)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "laneway-e2e-kind-")
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		return nil, err
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig([]byte(kc))
	if err != nil {
		return nil, fmt.Errorf("kind kubeconfig: %w", err)
	}
	scheme, err := testenv.Scheme()
	if err != nil {
		return nil, err
	}
	kube, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	a, err := newApplier(cfg)
	if err != nil {
		return nil, err
	}
	if err := a.applyInferencePoolCRD(ctx); err != nil {
		return nil, err
	}
	return &kindCluster{name: name, kubeconfig: path, cfg: cfg, kube: kube, cs: cs, apply: a}, nil
}

// kindValues are the chart values of every kind release: the images built
// here, the chart's Envoy data plane, and a pool of this release's
// modelsim pods.
const kindValues = `
epp:
  image: {repository: laneway-epp, tag: e2e, pullPolicy: Never}
  drainTimeoutSeconds: 10
  conformanceHooks: true # the scenarios pin requests with the conformance header
  resources: {requests: {cpu: 100m, memory: 64Mi}, limits: {memory: 512Mi}}
# The scenarios send class and priority hints through the chart's Envoy
# and test what the picker does with them.
trustClientHints: true
envoy:
  enabled: true
  resources: {requests: {cpu: 100m, memory: 64Mi}, limits: {memory: 512Mi}}
inferencePool:
  name: pool
  create: true
  selector: {app: modelsim}
  targetPorts: [8000]
`

// kindRelease is a release's handles in the kind cluster.
type kindRelease struct {
	c       *kindCluster
	r       *release
	ns      string
	release string
	stopFwd chan struct{}
}

func (c *kindCluster) install(t *testing.T, spec installSpec) *release {
	t.Helper()
	ctx := testContext(t, kindTimeout)
	ns := "e2e-" + spec.name
	if err := c.apply.ensureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = c.kube.Delete(dctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	})
	vf := filepath.Join(t.TempDir(), "values.yaml")
	if err := writeFile(vf, kindValues+"\n"+spec.values); err != nil {
		t.Fatal(err)
	}
	if _, err := run(ctx, "", helmBinary(t), "install", spec.name, chartDir(), "--namespace", ns, "--kubeconfig", c.kubeconfig,
		"-f", vf, "--wait", "--timeout", "5m"); err != nil {
		t.Fatal(err)
	}

	kr := &kindRelease{c: c, ns: ns, release: spec.name, stopFwd: make(chan struct{})}
	r := &release{t: t, ns: ns, pool: "pool", kube: c.kube, pods: map[string]*simPod{}, ops: kr, http: newHTTPClient()}
	kr.r = r
	for _, ps := range spec.pods {
		if err := c.kube.Create(ctx, simPodObject(ns, ps)); err != nil {
			t.Fatal(err)
		}
	}
	for _, ps := range spec.pods {
		ip, err := c.waitPod(ctx, ns, ps)
		if err != nil {
			t.Fatal(err)
		}
		r.pods[ps.name] = &simPod{name: ps.name, addr: net.JoinHostPort(ip, "8000")}
	}

	port, err := kr.forwardEnvoy(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { close(kr.stopFwd) })
	r.url = "http://127.0.0.1:" + strconv.Itoa(port)
	if err := waitPodsRouted(ctx, r, spec.pods); err != nil {
		t.Fatalf("%v\n%s", err, kr.diagnostics())
	}
	return r
}

// simPodObject is a modelsim pod: its instance name is the pod name, it is
// Ready when /health answers (or never, for notReady, whose probe asks a
// path modelsim does not serve), and a preStop pause lets the picker take
// it out of rotation before SIGTERM closes its listener, as a model server
// behind an endpoint picker should be deployed.
func simPodObject(ns string, ps podSpec) *corev1.Pod {
	probePath := "/health"
	if ps.notReady {
		probePath = "/never-ready"
	}
	args := append([]string{"--host=0.0.0.0", "--port=8000", "--instance=$(POD_NAME)", "--model=sim-model"}, simArgs...)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: ps.name, Namespace: ns, Labels: map[string]string{"app": "modelsim"}},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptrTo(int64(30)),
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptrTo(true),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{
				Name:            "modelsim",
				Image:           simImage,
				ImagePullPolicy: corev1.PullNever,
				Args:            args,
				Env: []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{
					FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8000}},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: probePath, Port: intstr.FromInt32(8000)}},
					PeriodSeconds: 1,
				},
				Lifecycle: &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 5}}},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptrTo(false), ReadOnlyRootFilesystem: ptrTo(true),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
}

// waitPod polls until the pod runs with an IP (and is Ready unless it is
// meant not to be) and returns its IP.
func (c *kindCluster) waitPod(ctx context.Context, ns string, ps podSpec) (string, error) {
	var ip, state string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, kindTimeout, true, func(ctx context.Context) (bool, error) {
		var pod corev1.Pod
		if err := c.kube.Get(ctx, client.ObjectKey{Namespace: ns, Name: ps.name}, &pod); err != nil {
			return false, err
		}
		ip, state = pod.Status.PodIP, string(pod.Status.Phase)
		if pod.Status.Phase != corev1.PodRunning || ip == "" {
			return false, nil
		}
		if ps.notReady {
			return true, nil
		}
		for _, cond := range pod.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return "", fmt.Errorf("pod %s/%s not running (%s): %w", ns, ps.name, state, err)
	}
	return ip, nil
}

// forwardEnvoy port-forwards a free local port to the release's Envoy pod
// (its listener, 8080), through the API server as kubectl port-forward
// does.
func (kr *kindRelease) forwardEnvoy(ctx context.Context) (int, error) {
	var pods corev1.PodList
	sel := client.MatchingLabels{"app.kubernetes.io/instance": kr.release, "app.kubernetes.io/component": "envoy"}
	if err := kr.c.kube.List(ctx, &pods, client.InNamespace(kr.ns), sel); err != nil || len(pods.Items) == 0 {
		return 0, fmt.Errorf("find the Envoy pod of %s: %v (%d pods)", kr.release, err, len(pods.Items))
	}
	port, err := launch.FreePort("127.0.0.1")
	if err != nil {
		return 0, err
	}
	transport, upgrader, err := spdy.RoundTripperFor(kr.c.cfg)
	if err != nil {
		return 0, err
	}
	url := kr.c.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(kr.ns).Name(pods.Items[0].Name).SubResource("portforward").URL()
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, url)
	ready := make(chan struct{})
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{fmt.Sprintf("%d:8080", port)}, kr.stopFwd, ready, io.Discard, io.Discard)
	if err != nil {
		return 0, err
	}
	errc := make(chan error, 1)
	go func() { errc <- fw.ForwardPorts() }()
	select {
	case <-ready:
		return port, nil
	case err := <-errc:
		return 0, fmt.Errorf("port-forward to Envoy: %w", err)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func (kr *kindRelease) beginPodDeletion(ctx context.Context, name string) error {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: kr.ns}}
	return kr.c.kube.Delete(ctx, pod, client.GracePeriodSeconds(30))
}

func (kr *kindRelease) finishPodDeletion(ctx context.Context, name string) error {
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		err := kr.c.kube.Get(ctx, client.ObjectKey{Namespace: kr.ns, Name: name}, &corev1.Pod{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	if err != nil {
		return fmt.Errorf("pod %s not gone: %w", name, err)
	}
	addr := kr.r.pods[name].addr
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		a := kr.r.send(ctx, request{strict: -1, pin: addr, promptTokens: 8})
		return a.status == http.StatusServiceUnavailable && a.reason == "no_endpoints", nil
	})
}

// restartPicker does what `kubectl rollout restart` does and waits for
// the rollout to finish: the new picker is Ready and the old one gone.
func (kr *kindRelease) restartPicker(ctx context.Context) error {
	name := kr.release + "-laneway"
	var dep appsv1.Deployment
	if err := kr.c.kube.Get(ctx, client.ObjectKey{Namespace: kr.ns, Name: name}, &dep); err != nil {
		return err
	}
	patch := client.MergeFrom(dep.DeepCopy())
	if dep.Spec.Template.Annotations == nil {
		dep.Spec.Template.Annotations = map[string]string{}
	}
	dep.Spec.Template.Annotations["kubectl.kubernetes.io/restartedAt"] = time.Now().Format(time.RFC3339Nano)
	if err := kr.c.kube.Patch(ctx, &dep, patch); err != nil {
		return fmt.Errorf("restart %s: %w", name, err)
	}
	gen := dep.Generation
	return wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, kindTimeout, true, func(ctx context.Context) (bool, error) {
		if err := kr.c.kube.Get(ctx, client.ObjectKey{Namespace: kr.ns, Name: name}, &dep); err != nil {
			return false, err
		}
		s := dep.Status
		want := *dep.Spec.Replicas
		return s.ObservedGeneration >= gen && s.UpdatedReplicas == want && s.Replicas == want && s.AvailableReplicas == want, nil
	})
}

// pickerMetrics reads the picker's /metrics through the API server's
// service proxy (the Service reaches only the Ready picker).
func (kr *kindRelease) pickerMetrics(ctx context.Context) ([]byte, error) {
	return kr.c.cs.CoreV1().Services(kr.ns).ProxyGet("http", kr.release+"-laneway", "9090", "/metrics", nil).DoRaw(ctx)
}

func (kr *kindRelease) diagnostics() string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var pods corev1.PodList
	sel := client.MatchingLabels{"app.kubernetes.io/instance": kr.release, "app.kubernetes.io/component": "endpoint-picker"}
	if err := kr.c.kube.List(ctx, &pods, client.InNamespace(kr.ns), sel); err != nil {
		return "list picker pods: " + err.Error()
	}
	var b strings.Builder
	for _, p := range pods.Items {
		raw, err := kr.c.cs.CoreV1().Pods(kr.ns).GetLogs(p.Name, &corev1.PodLogOptions{TailLines: ptrTo(int64(200))}).DoRaw(ctx)
		fmt.Fprintf(&b, "== picker pod %s (%v)\n%s\n", p.Name, err, raw)
	}
	return b.String()
}

// writeFile writes s to path.
func writeFile(path, s string) error {
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// TestKindManifestsAccepted checks, without docker, what the kind
// environment would create: the chart rendered with the kind values and
// each scenario's policy, and the modelsim pod objects (preStop sleep,
// probes, security context), all applied to the real API server
// (server-side dry run for the pods, which no kubelet would run here).
func TestKindManifestsAccepted(t *testing.T) {
	cfg := apiServer(t)
	ctx := testContext(t, 3*time.Minute)
	a, err := newApplier(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.applyInferencePoolCRD(ctx); err != nil {
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
	scenarios := map[string]string{
		"routing":  "",
		"weighted": weightedValues(512, 128),
		"strict":   oneClassValues("standard", ""),
		"limit":    oneClassValues("limited", ", requestQueueLimitPerWorker: 5"),
		"delete":   oneClassValues("standard", ", requestQueueLimitPerWorker: 1024"),
	}
	for _, name := range sortedKeys(scenarios) {
		ns := "kind-" + name
		objs := render(t, renderArgs{release: name, namespace: ns, values: kindValues + "\n" + scenarios[name]})
		if findObject(objs, "Deployment", name+"-laneway-envoy") == nil {
			t.Fatalf("%s: the kind values render no Envoy: %v", name, kinds(objs))
		}
		if err := a.ensureNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
		if err := a.apply(ctx, objs); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, ps := range []podSpec{{name: "sim-a"}, {name: "sim-c", notReady: true}} {
			if err := kube.Create(ctx, simPodObject(ns, ps), client.DryRunAll); err != nil {
				t.Errorf("%s: modelsim pod %s refused: %v", name, ps.name, err)
			}
		}
	}
}
