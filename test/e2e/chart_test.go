package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	"sigs.k8s.io/yaml"

	"github.com/laneway-dev/laneway/api/v1alpha1"
	"github.com/laneway-dev/laneway/internal/ha"
	"github.com/laneway-dev/laneway/internal/metrics"
	"github.com/laneway-dev/laneway/internal/status"
	"github.com/laneway-dev/laneway/pkg/policy"
)

// ciValueSets returns charts/laneway/ci/*-values.yaml by short name
// ("default", "ha", ...), the value sets `make lint-chart` renders.
func ciValueSets(t testing.TB) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir(), "ci", "*-values.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no value sets in %s/ci (%v)", chartDir(), err)
	}
	sets := map[string]string{}
	for _, f := range files {
		sets[strings.TrimSuffix(filepath.Base(f), "-values.yaml")] = f
	}
	return sets
}

// fromUnstructured converts a rendered object to its typed form.
func fromUnstructured[T any](t testing.TB, o *unstructured.Unstructured) *T {
	t.Helper()
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, out, true); err != nil {
		t.Fatalf("%s %s does not convert to %T: %v", o.GetKind(), o.GetName(), out, err)
	}
	return out
}

// TestChartCRDsInSync keeps the chart's CRD copies identical to the
// generated and vendored ones in config/crd; `make chart-crds` copies them.
func TestChartCRDsInSync(t *testing.T) {
	pairs := []struct{ chart, config string }{
		{"crds/laneway.dev_policyclasses.yaml", "config/crd/bases/laneway.dev_policyclasses.yaml"},
		{"crds/laneway.dev_policyprofiles.yaml", "config/crd/bases/laneway.dev_policyprofiles.yaml"},
		{"files/inference.networking.k8s.io_inferencepools.yaml", "config/crd/external/inference.networking.k8s.io_inferencepools.yaml"},
	}
	// Every generated CRD must be in the chart, not only the ones above.
	bases, err := filepath.Glob(filepath.Join(shared.root, "config", "crd", "bases", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(bases) != 2 {
		t.Errorf("config/crd/bases holds %d CRDs, the chart ships 2: add the new one to charts/laneway/crds and this test", len(bases))
	}
	for _, p := range pairs {
		got, err := os.ReadFile(filepath.Join(chartDir(), p.chart))
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.Join(shared.root, p.config))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("charts/laneway/%s differs from %s; run `make chart-crds`", p.chart, p.config)
		}
	}
}

// TestChartRoleMatchesConfigRBAC: the chart's Role grants exactly the
// rules of config/rbac/role.yaml, which controller-gen generates from the
// controllers' RBAC markers, so the chart can neither grant more than the
// picker needs nor miss a rule it needs.
func TestChartRoleMatchesConfigRBAC(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(shared.root, "config", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var want rbacv1.Role
	if err := yaml.UnmarshalStrict(raw, &want); err != nil {
		t.Fatalf("config/rbac/role.yaml: %v", err)
	}
	if len(want.Rules) == 0 {
		t.Fatal("config/rbac/role.yaml has no rules")
	}
	for name, file := range ciValueSets(t) {
		objs := render(t, renderArgs{release: "rbac", namespace: "ns-" + name, valuesFiles: []string{file}})
		role := fromUnstructured[rbacv1.Role](t, mustFind(t, objs, "Role", ""))
		// config/rbac names the Lease of its placeholder pool "pool"; the
		// chart names its own pool's.
		pool := findObject(objs, "InferencePool", "")
		poolName := "rbac-laneway"
		if pool != nil {
			poolName = pool.GetName()
		}
		wantRules := slices.Clone(want.Rules)
		for i, r := range wantRules {
			if slices.Equal(r.ResourceNames, []string{ha.LeaseName("pool")}) {
				wantRules[i].ResourceNames = []string{ha.LeaseName(poolName)}
			}
		}
		if !reflect.DeepEqual(role.Rules, wantRules) {
			gotY, _ := yaml.Marshal(role.Rules)
			wantY, _ := yaml.Marshal(wantRules)
			t.Errorf("%s: chart Role rules differ from config/rbac/role.yaml (with the pool's Lease named); copy them into templates/rbac.yaml\nchart:\n%s\nconfig/rbac:\n%s", name, gotY, wantY)
		}
		if role.Namespace != "ns-"+name {
			t.Errorf("%s: Role in namespace %q, want the release namespace", name, role.Namespace)
		}
		binding := fromUnstructured[rbacv1.RoleBinding](t, mustFind(t, objs, "RoleBinding", ""))
		sa := mustFind(t, objs, "ServiceAccount", "")
		dep := fromUnstructured[appsv1.Deployment](t, mustFind(t, objs, "Deployment", role.Name))
		if binding.RoleRef.Name != role.Name || len(binding.Subjects) != 1 || binding.Subjects[0].Name != sa.GetName() ||
			dep.Spec.Template.Spec.ServiceAccountName != sa.GetName() {
			t.Errorf("%s: RoleBinding %+v does not bind Role %s to the picker's ServiceAccount %s (pod uses %s)",
				name, binding, role.Name, sa.GetName(), dep.Spec.Template.Spec.ServiceAccountName)
		}
	}
}

// wantKinds is how many objects of each kind each CI value set renders;
// the apply test checks the rendering against it, so a template that
// silently renders nothing (or too much) fails.
var wantKinds = map[string]map[string]int{
	"default": {"NetworkPolicy": 1, "CustomResourceDefinition": 2, "ServiceAccount": 1, "Role": 1, "RoleBinding": 1, "Service": 1, "Deployment": 1},
	"pool-policy": {"NetworkPolicy": 1, "CustomResourceDefinition": 3, "ServiceAccount": 1, "Role": 1, "RoleBinding": 1, "Service": 1, "Deployment": 1,
		"InferencePool": 1, "PolicyProfile": 1, "PolicyClass": 2},
	"ha": {"NetworkPolicy": 1, "CustomResourceDefinition": 2, "ServiceAccount": 1, "Role": 1, "RoleBinding": 1, "Service": 1, "Deployment": 1,
		"InferencePool": 1, "PodDisruptionBudget": 1, "Secret": 1},
	"envoy": {"NetworkPolicy": 1, "CustomResourceDefinition": 2, "ServiceAccount": 1, "Role": 1, "RoleBinding": 1, "Service": 2, "Deployment": 2,
		"ConfigMap": 1, "InferencePool": 1, "PolicyClass": 2},
	"monitoring": {"NetworkPolicy": 1, "CustomResourceDefinition": 2, "ServiceAccount": 1, "Role": 1, "RoleBinding": 1, "Service": 1, "Deployment": 1,
		"ServiceMonitor": 1, "ConfigMap": 1},
	"conformance": {"CustomResourceDefinition": 3, "ServiceAccount": 1, "Role": 1, "RoleBinding": 1, "Service": 1, "Deployment": 1,
		"InferencePool": 1},
	"full": {"NetworkPolicy": 1, "CustomResourceDefinition": 2, "ServiceAccount": 1, "Role": 1, "RoleBinding": 1, "Service": 1, "Deployment": 1,
		"InferencePool": 1, "PolicyProfile": 1, "PolicyClass": 4},
	"tenants": {"NetworkPolicy": 1, "CustomResourceDefinition": 2, "ServiceAccount": 1, "Role": 1, "RoleBinding": 1, "Service": 2, "Deployment": 2,
		"ConfigMap": 1, "InferencePool": 1, "PolicyProfile": 1, "PolicyClass": 4},
}

// serviceMonitorCRD is a stand-in for the Prometheus Operator's CRD, which
// envtest does not have: the same group, kind and version, with the schema
// of the fields the chart sets (so a wrong type or an unknown field is
// still refused). It is the only object not from the chart.
const serviceMonitorCRD = "testdata/servicemonitor-crd.yaml"

// TestChartValueSetsApply renders the chart with every CI value set and
// applies every rendered object to a real kube-apiserver: the chart's own
// CRDs first, then each set's objects in a namespace of its own, with
// server-side apply (a real create). Every object must be accepted and be
// readable afterwards.
func TestChartValueSetsApply(t *testing.T) {
	cfg := apiServer(t)
	ctx := testContext(t, 3*time.Minute)
	a, err := newApplier(cfg)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(serviceMonitorCRD)
	if err != nil {
		t.Fatal(err)
	}
	smCRD, err := decodeObjects(string(raw))
	if err != nil || len(smCRD) != 1 || !isCRD(smCRD[0]) {
		t.Fatalf("%s: want one CRD, got %d objects (%v)", serviceMonitorCRD, len(smCRD), err)
	}

	sets := ciValueSets(t)
	if len(sets) != len(wantKinds) {
		t.Errorf("%d CI value sets, wantKinds describes %d: keep them in step", len(sets), len(wantKinds))
	}
	names := make([]string, 0, len(sets))
	for n := range sets {
		names = append(names, n)
	}
	sort.Strings(names)
	rendered := map[string][]*unstructured.Unstructured{}
	crds := map[string]*unstructured.Unstructured{smCRD[0].GetName(): smCRD[0]}
	for _, name := range names {
		objs := render(t, renderArgs{release: "laneway", namespace: "ci-" + name, valuesFiles: []string{sets[name]}})
		rendered[name] = objs
		got := map[string]int{}
		for _, o := range objs {
			got[o.GetKind()]++
			if isCRD(o) {
				crds[o.GetName()] = o
			} else if o.GetNamespace() != "ci-"+name {
				t.Errorf("%s: %s/%s is in namespace %q, want the release namespace", name, o.GetKind(), o.GetName(), o.GetNamespace())
			}
		}
		if want, ok := wantKinds[name]; ok && !reflect.DeepEqual(got, want) {
			t.Errorf("%s renders %v, want %v\nobjects: %s", name, got, want, strings.Join(kinds(objs), ", "))
		}
	}
	// CRDs are cluster-scoped and shared by every set: install them once,
	// from the chart.
	crdList := make([]*unstructured.Unstructured, 0, len(crds))
	for _, n := range sortedKeys(crds) {
		crdList = append(crdList, crds[n])
	}
	if err := a.apply(ctx, crdList); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			ns := "ci-" + name
			if err := a.ensureNamespace(ctx, ns); err != nil {
				t.Fatal(err)
			}
			var objs []*unstructured.Unstructured
			for _, o := range rendered[name] {
				if !isCRD(o) {
					objs = append(objs, o)
				}
			}
			if err := a.apply(ctx, objs); err != nil {
				t.Fatal(err)
			}
			for _, o := range objs {
				if err := a.exists(ctx, o); err != nil {
					t.Errorf("read back %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
				}
			}
			t.Logf("%s: %d objects accepted: %s", name, len(objs), strings.Join(kinds(objs), ", "))
		})
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// TestChartPolicyMatchesConvert: the chart's PolicyProfile and PolicyClass
// objects for the SPEC §11 policy and for the tenants sample are what
// `laneway convert` makes of the same policy YAML, and every CI value
// set's policy objects form a valid policy for pkg/policy (the picker's
// own check).
func TestChartPolicyMatchesConvert(t *testing.T) {
	sets := ciValueSets(t)
	for set, sample := range map[string]string{"pool-policy": "policy-premium-regular.yaml", "tenants": "policy-tenants.yaml"} {
		objs := render(t, renderArgs{release: "laneway", namespace: "ml", valuesFiles: []string{sets[set]}})
		cfg, err := policy.LoadFile(filepath.Join(shared.root, "config", "samples", sample))
		if err != nil {
			t.Fatal(err)
		}
		wantProf, wantClasses := policy.ToObjects(cfg, "llm", "ml")
		gotProf := fromUnstructured[v1alpha1.PolicyProfile](t, mustFind(t, objs, "PolicyProfile", "llm"))
		if !reflect.DeepEqual(gotProf.Spec, wantProf.Spec) {
			t.Errorf("%s: PolicyProfile spec\n got %+v\nwant %+v", set, gotProf.Spec, wantProf.Spec)
		}
		for _, want := range wantClasses {
			got := fromUnstructured[v1alpha1.PolicyClass](t, mustFind(t, objs, "PolicyClass", want.Name))
			if !reflect.DeepEqual(got.Spec, want.Spec) {
				t.Errorf("%s: PolicyClass %s spec\n got %+v\nwant %+v", set, want.Name, got.Spec, want.Spec)
			}
			if got.Labels[policy.PoolLabel] != "llm" {
				t.Errorf("%s: PolicyClass %s labels %v, want %s=llm", set, got.Name, got.Labels, policy.PoolLabel)
			}
		}
	}

	for name, file := range sets {
		objs := render(t, renderArgs{release: "laneway", namespace: "ml", valuesFiles: []string{file}})
		var profs []v1alpha1.PolicyProfile
		var classes []v1alpha1.PolicyClass
		for _, o := range objs {
			switch o.GetKind() {
			case "PolicyProfile":
				profs = append(profs, *fromUnstructured[v1alpha1.PolicyProfile](t, o))
			case "PolicyClass":
				classes = append(classes, *fromUnstructured[v1alpha1.PolicyClass](t, o))
			}
		}
		if _, problems := policy.FromObjects(profs, classes); len(problems) > 0 {
			t.Errorf("%s: the rendered policy is invalid: %v", name, problems)
		}
	}
}

// TestChartEPPDeployment checks the picker's pod against the chart's
// promises: gRPC probes on the health services, the three ports, the
// hardened security context, the flags, and leader election exactly when
// there is more than one replica.
func TestChartEPPDeployment(t *testing.T) {
	sets := ciValueSets(t)
	tests := []struct {
		set      string
		extra    []string
		replicas int32
		leader   bool
	}{
		{set: "default", replicas: 1},
		{set: "ha", replicas: 2, leader: true},
		{set: "default", extra: []string{"epp.leaderElection=enabled"}, replicas: 1, leader: true},
		{set: "ha", extra: []string{"epp.leaderElection=auto", "epp.replicas=3"}, replicas: 3, leader: true},
	}
	for _, tc := range tests {
		t.Run(tc.set+"/"+strings.Join(tc.extra, ","), func(t *testing.T) {
			objs := render(t, renderArgs{release: "lw", namespace: "pool-ns", valuesFiles: []string{sets[tc.set]}, set: tc.extra})
			dep := fromUnstructured[appsv1.Deployment](t, mustFind(t, objs, "Deployment", "lw-laneway"))
			if *dep.Spec.Replicas != tc.replicas {
				t.Errorf("replicas %d, want %d", *dep.Spec.Replicas, tc.replicas)
			}
			pod := dep.Spec.Template.Spec
			if len(pod.Containers) != 1 {
				t.Fatalf("%d containers", len(pod.Containers))
			}
			c := pod.Containers[0]
			args := strings.Join(c.Args, " ")
			for _, want := range []string{"--pool-name=lw-laneway", "--pool-namespace=pool-ns", "--pool-group=inference.networking.k8s.io",
				"--grpc-port=9002", "--grpc-health-port=9003", "--metrics-port=9090", "--status-port=9091", "--status-bind=127.0.0.1", "--secure-serving=true",
				"--max-num-batched-tokens=8192", "--engine-type=vllm", "--drain-timeout=30s",
				"--role-label=llm-d.ai/role", "--disaggregate-above-uncached-tokens=256"} {
				if tc.set == "ha" && strings.HasPrefix(want, "--pool-name") {
					continue
				}
				if !slices.Contains(c.Args, want) {
					t.Errorf("args %q lack %s", args, want)
				}
			}
			if got := slices.Contains(c.Args, "--ha-enable-leader-election"); got != tc.leader {
				t.Errorf("--ha-enable-leader-election present = %v, want %v (args %s)", got, tc.leader, args)
			}
			ports := map[string]int32{}
			for _, p := range c.Ports {
				ports[p.Name] = p.ContainerPort
			}
			wantPorts := map[string]int32{"grpc-ext-proc": 9002, "grpc-health": 9003, "http-metrics": 9090}
			if tc.leader {
				wantPorts["grpc-replica"] = 9004
				for _, want := range []string{"--replica-cert-path=/etc/laneway/replica", "--replica-port=9004"} {
					if !slices.Contains(c.Args, want) {
						t.Errorf("args %q lack %s", args, want)
					}
				}
			}
			if !reflect.DeepEqual(ports, wantPorts) {
				t.Errorf("ports %v, want %v", ports, wantPorts)
			}
			for _, p := range []struct {
				probe   *corev1.Probe
				service string
			}{{c.LivenessProbe, "liveness"}, {c.ReadinessProbe, "readiness"}} {
				if p.probe == nil || p.probe.GRPC == nil || p.probe.GRPC.Port != 9003 || p.probe.GRPC.Service == nil || *p.probe.GRPC.Service != p.service {
					t.Errorf("%s probe %+v, want gRPC on 9003 service %q", p.service, p.probe, p.service)
				}
			}
			sc := c.SecurityContext
			if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
				sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil ||
				!reflect.DeepEqual(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || sc.SeccompProfile == nil ||
				sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("container security context %+v is not hardened", sc)
			}
			if psc := pod.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
				t.Errorf("pod security context %+v does not require non-root", psc)
			}
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
				t.Errorf("resources %+v lack a CPU request or memory limit", c.Resources)
			}
			if pod.TerminationGracePeriodSeconds == nil || *pod.TerminationGracePeriodSeconds != 45 {
				t.Errorf("terminationGracePeriodSeconds %v, want drain 30 + 15", pod.TerminationGracePeriodSeconds)
			}
		})
	}

	// The Service: ext_proc with appProtocol http2, plus metrics.
	objs := render(t, renderArgs{release: "lw", namespace: "pool-ns"})
	svc := fromUnstructured[corev1.Service](t, mustFind(t, objs, "Service", "lw-laneway"))
	want := []corev1.ServicePort{
		{Name: "grpc-ext-proc", Port: 9002, TargetPort: intstr.FromString("grpc-ext-proc"), Protocol: corev1.ProtocolTCP, AppProtocol: ptrTo("http2")},
		{Name: "http-metrics", Port: 9090, TargetPort: intstr.FromString("http-metrics"), Protocol: corev1.ProtocolTCP, AppProtocol: ptrTo("http")},
	}
	if !reflect.DeepEqual(svc.Spec.Ports, want) {
		t.Errorf("Service ports %+v, want %+v", svc.Spec.Ports, want)
	}
	dep := fromUnstructured[appsv1.Deployment](t, mustFind(t, objs, "Deployment", "lw-laneway"))
	for k, v := range svc.Spec.Selector {
		if dep.Spec.Template.Labels[k] != v {
			t.Errorf("Service selector %v does not select the picker's pods %v", svc.Spec.Selector, dep.Spec.Template.Labels)
		}
	}
}

// TestChartEPPGoRuntimeEnv: by default the picker's GOMAXPROCS comes from
// its CPU request (rounded up by the downward API) and its container's
// memory limit in bytes reaches it as LANEWAY_MEMORY_LIMIT_BYTES, from
// which it sets the Go memory limit to 90% (so the Go runtime collects
// harder before the kernel kills it, with room for what the runtime does
// not count) and --max-held-body-bytes defaults to half of that; the
// downward API sees a limit a LimitRange set, which the values do not.
// GOMAXPROCS or GOMEMLIMIT in extraEnv replaces the derived entry rather
// than adding a second one; a value turns each off.
func TestChartEPPGoRuntimeEnv(t *testing.T) {
	sets := ciValueSets(t)
	fromResource := func(name, res string) []corev1.EnvVar {
		return []corev1.EnvVar{{Name: name, ValueFrom: &corev1.EnvVarSource{
			ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: res, Divisor: resource.MustParse("1")},
		}}}
	}
	tests := []struct {
		name       string
		env        string // the variable checked
		files      []string
		set        []string
		values     string
		deployment string          // "" is lw-laneway
		want       []corev1.EnvVar // the env entries named env
	}{
		{name: "GOMAXPROCS default", env: "GOMAXPROCS", want: fromResource("GOMAXPROCS", "requests.cpu")},
		{name: "GOMAXPROCS extraEnv wins", env: "GOMAXPROCS", files: []string{sets["full"]}, deployment: "laneway-full",
			want: []corev1.EnvVar{{Name: "GOMAXPROCS", Value: "2"}}},
		{name: "GOMAXPROCS off", env: "GOMAXPROCS", set: []string{"epp.gomaxprocsFromCPURequest=false"}},
		{name: "GOMEMLIMIT default: none, the limit instead", env: "GOMEMLIMIT"},
		{name: "memory limit default", env: "LANEWAY_MEMORY_LIMIT_BYTES", want: fromResource("LANEWAY_MEMORY_LIMIT_BYTES", "limits.memory")},
		{name: "GOMEMLIMIT extraEnv wins", env: "GOMEMLIMIT", values: "epp:\n  extraEnv: [{name: GOMEMLIMIT, value: 900MiB}]\n",
			want: []corev1.EnvVar{{Name: "GOMEMLIMIT", Value: "900MiB"}}},
		{name: "GOMEMLIMIT extraEnv: no limit variable", env: "LANEWAY_MEMORY_LIMIT_BYTES", values: "epp:\n  extraEnv: [{name: GOMEMLIMIT, value: 900MiB}]\n"},
		{name: "memory limit off", env: "LANEWAY_MEMORY_LIMIT_BYTES", set: []string{"epp.gomemlimitFromMemoryLimit=false"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, renderArgs{release: "lw", namespace: "pool-ns", valuesFiles: tc.files, set: tc.set, values: tc.values})
			name := tc.deployment
			if name == "" {
				name = "lw-laneway"
			}
			dep := fromUnstructured[appsv1.Deployment](t, mustFind(t, objs, "Deployment", name))
			var got []corev1.EnvVar
			for _, e := range dep.Spec.Template.Spec.Containers[0].Env {
				if e.Name == tc.env {
					got = append(got, e)
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("%s env %+v, want %+v", tc.env, got, tc.want)
			}
		})
	}
}

// TestChartEPPConformanceHooks: the conformance hooks (a request header
// that pins requests to pods) are off unless the values ask for them, as
// the conformance value set does.
func TestChartEPPConformanceHooks(t *testing.T) {
	sets := ciValueSets(t)
	tests := []struct {
		name  string
		files []string
		set   []string
		want  bool
	}{
		{name: "default"},
		{name: "conformance set", files: []string{sets["conformance"]}, want: true},
		{name: "value", set: []string{"epp.conformanceHooks=true"}, want: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, renderArgs{release: "lw", namespace: "pool-ns", valuesFiles: tc.files, set: tc.set})
			dep := fromUnstructured[appsv1.Deployment](t, mustFind(t, objs, "Deployment", "lw-laneway"))
			args := dep.Spec.Template.Spec.Containers[0].Args
			if got := slices.Contains(args, "--enable-conformance-hooks"); got != tc.want {
				t.Errorf("--enable-conformance-hooks in args: %t, want %t (args %q)", got, tc.want, args)
			}
		})
	}
}

// TestChartInferencePool: the created pool points its endpointPickerRef at
// the chart's Service on the ext_proc port, with the values' selector,
// ports and failure mode.
func TestChartInferencePool(t *testing.T) {
	sets := ciValueSets(t)
	tests := []struct {
		set      string
		name     string
		ports    []inferencev1.PortNumber
		failure  inferencev1.EndpointPickerFailureMode
		protocol inferencev1.AppProtocol
		service  string
	}{
		{set: "pool-policy", name: "llm", ports: []inferencev1.PortNumber{8000}, failure: inferencev1.EndpointPickerFailClose, protocol: inferencev1.AppProtocolHTTP, service: "laneway"},
		{set: "ha", name: "laneway", ports: []inferencev1.PortNumber{8000, 8001}, failure: inferencev1.EndpointPickerFailClose, protocol: inferencev1.AppProtocolHTTP, service: "laneway"},
		{set: "full", name: "llama", ports: []inferencev1.PortNumber{8000, 8001, 8002, 8003}, failure: inferencev1.EndpointPickerFailOpen, protocol: inferencev1.AppProtocolH2C, service: "laneway-full"},
	}
	for _, tc := range tests {
		t.Run(tc.set, func(t *testing.T) {
			objs := render(t, renderArgs{release: "laneway", namespace: "ml", valuesFiles: []string{sets[tc.set]}})
			pool := fromUnstructured[inferencev1.InferencePool](t, mustFind(t, objs, "InferencePool", tc.name))
			var ports []inferencev1.PortNumber
			for _, p := range pool.Spec.TargetPorts {
				ports = append(ports, p.Number)
			}
			if !reflect.DeepEqual(ports, tc.ports) || pool.Spec.AppProtocol != tc.protocol {
				t.Errorf("targetPorts %v appProtocol %q, want %v %q", ports, pool.Spec.AppProtocol, tc.ports, tc.protocol)
			}
			ref := pool.Spec.EndpointPickerRef
			if ref == nil || ref.Name != inferencev1.ObjectName(tc.service) || ref.Kind != "Service" || ref.Port == nil || ref.Port.Number != 9002 || ref.FailureMode != tc.failure {
				t.Fatalf("endpointPickerRef %+v, want Service %s port 9002 %s", ref, tc.service, tc.failure)
			}
			svc := mustFind(t, objs, "Service", tc.service)
			if svc.GetNamespace() != pool.Namespace {
				t.Errorf("picker Service in %s, pool in %s", svc.GetNamespace(), pool.Namespace)
			}
			dep := fromUnstructured[appsv1.Deployment](t, mustFind(t, objs, "Deployment", tc.service))
			if !slices.Contains(dep.Spec.Template.Spec.Containers[0].Args, "--pool-name="+tc.name) {
				t.Errorf("picker args %v do not name pool %s", dep.Spec.Template.Spec.Containers[0].Args, tc.name)
			}
		})
	}
}

// TestChartSchemaRejects: values.schema.json and the templates' own checks
// refuse bad values with a message that names the value.
func TestChartSchemaRejects(t *testing.T) {
	tests := []struct {
		name, values string
		// want are substrings of helm's error, all required.
		want []string
	}{
		{"quantum 0", "policy:\n  classes:\n  - {name: a, quantum: 0}\n", []string{"/policy/classes/0/quantum", "minimum"}},
		{"quantum not a number", "policy:\n  classes:\n  - {name: a, quantum: lots}\n", []string{"/policy/classes/0/quantum"}},
		{"class without quantum", "policy:\n  classes:\n  - {name: a}\n", []string{"/policy/classes/0", "quantum"}},
		{"class without name", "policy:\n  classes:\n  - {quantum: 1}\n", []string{"/policy/classes/0", "name"}},
		{"unknown queue policy", "policy:\n  classes:\n  - {name: a, quantum: 1, queuePolicy: lifo}\n", []string{"/policy/classes/0/queuePolicy"}},
		{"bad class name", "policy:\n  classes:\n  - {name: 'a b', quantum: 1}\n", []string{"/policy/classes/0/name"}},
		{"misspelt class field", "policy:\n  classes:\n  - {name: a, quantum: 1, quantums: 2}\n", []string{"/policy/classes/0", "quantums"}},
		{"fraction as a number", "policy:\n  classes:\n  - {name: a, quantum: 1, prefillBusyThresholdFrac: 0.5}\n", []string{"/policy/classes/0/prefillBusyThresholdFrac", "string"}},
		{"family without bucket", "policy:\n  classes:\n  - {name: a, quantum: 1, policyFamily: f}\n", []string{"/policy/classes/0", "cacheBucket"}},
		{"ratio without threshold", "policy:\n  classes:\n  - {name: a, quantum: 1, busyWorkerRatio: '0.5'}\n", []string{"/policy/classes/0"}},
		{"negative limit", "policy:\n  classes:\n  - {name: a, quantum: 1, requestQueueLimitPerWorker: -1}\n", []string{"/policy/classes/0/requestQueueLimitPerWorker"}},
		{"bad queue wait", "policy:\n  classes:\n  - {name: a, quantum: 1, maxQueueWait: soon}\n", []string{"/policy/classes/0/maxQueueWait"}},
		{"profile family without buckets", "policy:\n  profile: {defaultPolicyFamily: f}\n", []string{"/policy/profile", "uncachedISLBuckets"}},
		{"duplicate object names", "policy:\n  classes:\n  - {name: A, quantum: 1}\n  - {name: a, quantum: 1}\n", []string{"policy.classes[1]", "objectName"}},
		{"zero replicas", "epp:\n  replicas: 0\n", []string{"/epp/replicas"}},
		{"leader election off with replicas", "epp:\n  replicas: 2\n  leaderElection: disabled\n", []string{"epp.leaderElection", "replicas"}},
		{"unknown leader election mode", "epp:\n  leaderElection: sometimes\n", []string{"/epp/leaderElection"}},
		{"unknown engine", "epp:\n  engineType: tgi\n", []string{"/epp/engineType"}},
		{"role label not a label key", "epp:\n  roleLabel: \"my role\"\n", []string{"/epp/roleLabel"}},
		{"port out of range", "epp:\n  ports: {grpc: 70000, health: 9003, metrics: 9090}\n", []string{"/epp/ports/grpc"}},
		{"nine target ports", "inferencePool:\n  targetPorts: [1, 2, 3, 4, 5, 6, 7, 8, 9]\n", []string{"/inferencePool/targetPorts"}},
		{"unknown failure mode", "inferencePool:\n  failureMode: Open\n", []string{"/inferencePool/failureMode"}},
		{"unknown app protocol", "inferencePool:\n  appProtocol: grpc\n", []string{"/inferencePool/appProtocol"}},
		{"no selector for a created pool", "inferencePool:\n  create: true\n  selector: null\n", []string{"inferencePool.selector"}},
		{"misspelt top-level key", "inferencepool:\n  create: true\n", []string{"inferencepool"}},
		{"bad envoy timeout", "envoy:\n  messageTimeout: 5m\n", []string{"/envoy/messageTimeout"}},
		{"upper-case identity header", "policy:\n  profile:\n    identity: {header: X-Tenant}\n", []string{"/policy/profile/identity/header"}},
		{"identity without a source", "policy:\n  profile:\n    identity: {anonymous: x}\n", []string{"/policy/profile/identity"}},
		{"metadata without path", "policy:\n  profile:\n    identity: {metadata: {namespace: ns}}\n", []string{"/policy/profile/identity/metadata", "path"}},
		{"binding without match", "policy:\n  profile:\n    tenants: [{name: a}]\n", []string{"/policy/profile/tenants/0", "match"}},
		{"tenant weight 0", "policy:\n  profile:\n    tenants: [{name: a, match: {exact: [a]}, weight: 0}]\n", []string{"/policy/profile/tenants/0/weight", "minimum"}},
		{"allowed without default", "policy:\n  profile:\n    defaultTenant: {allowed: [a]}\n", []string{"/policy/profile/defaultTenant", "defaultFamily"}},
		{"strict cap beyond uint32", "policy:\n  profile:\n    defaultTenant: {maxStrictPriority: 4294967296}\n", []string{"/policy/profile/defaultTenant/maxStrictPriority"}},
		{"misspelt tenant field", "policy:\n  profile:\n    defaultTenant: {weigth: 2}\n", []string{"/policy/profile/defaultTenant", "weigth"}},
		{"maxTenants without tenantFairness", "policy:\n  classes:\n  - {name: a, quantum: 1, maxTenants: 5}\n", []string{"/policy/classes/0", "tenantFairness"}},
		{"jwt without keys", "envoy:\n  enabled: true\n  jwt: {provider: p, issuer: i}\n", []string{"envoy.jwt", "remoteJwksUri or localJwks"}},
		{"jwt with both keys", "envoy:\n  enabled: true\n  jwt: {provider: p, issuer: i, localJwks: '{}', remoteJwksUri: 'https://a/k'}\n", []string{"envoy.jwt", "not both"}},
		{"jwt without issuer", "envoy:\n  enabled: true\n  jwt: {provider: p, localJwks: '{}'}\n", []string{"envoy.jwt", "issuer"}},
		{"jwks not a URL", "envoy:\n  jwt: {remoteJwksUri: 'auth.example.com'}\n", []string{"/envoy/jwt/remoteJwksUri"}},
		{"metadata path not under the provider", "envoy:\n  enabled: true\n  jwt: {provider: p, issuer: i, localJwks: '{}'}\n" +
			"policy:\n  profile:\n    identity: {metadata: {namespace: envoy.filters.http.jwt_authn, path: [other, sub]}}\n",
			[]string{"policy.profile.identity.metadata.path", `envoy.jwt.provider "p"`}},
		{"client CA from two sources", "epp:\n  clientCA: {secret: a, configMap: b}\n", []string{"epp.clientCA", "not both"}},
		{"client CA without TLS", "epp:\n  secureServing: false\n  clientCA: {secret: a}\n", []string{"epp.clientCA needs epp.secureServing"}},
		{"replica certificate lifetime not a duration", "epp:\n  replicaIdentity: {certManager: {duration: 90d}}\n", []string{"/epp/replicaIdentity/certManager/duration"}},
		{"client CA without Envoy's certificate", "envoy:\n  enabled: true\nepp:\n  clientCA: {secret: a}\n", []string{"envoy.clientCertSecret", "epp.clientCA"}},
		{"Envoy certificate without TLS", "envoy:\n  enabled: true\n  clientCertSecret: c\nepp:\n  secureServing: false\n", []string{"envoy.clientCertSecret needs epp.secureServing"}},
		{"client CA key with a slash", "epp:\n  clientCA: {secret: a, key: ca/crt}\n", []string{"/epp/clientCA/key"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := helmTemplate(t, renderArgs{release: "bad", namespace: "ml", values: tc.values})
			if err == nil {
				t.Fatalf("values accepted:\n%s\nrendered %d bytes", tc.values, len(out))
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q:\n%v", w, err)
				}
			}
		})
	}
}

// dashboardMetrics returns the metric names the dashboard's queries name
// (histograms by their family name), and fails on a panel without query.
func dashboardMetrics(t testing.TB) (map[string]bool, []byte) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(chartDir(), "files", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	if dash.UID == "" || dash.Title == "" {
		t.Error("dashboard lacks a uid or title")
	}
	metricRe := regexp.MustCompile(`\b(laneway_[a-z_]+|dynamo_frontend_router_[a-z_]+)`)
	used := map[string]bool{}
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, m := range metricRe.FindAllString(tg.Expr, -1) {
				used[strings.TrimSuffix(m, "_bucket")] = true
			}
		}
	}
	return used, raw
}

// TestChartDashboard: every series of the picker's core registry
// (internal/metrics) has a panel, and the ConfigMap carries the file
// unchanged. The series other packages export (scrapes, prefix index)
// are checked against a running picker by the e2e suite
// (checkPickerMetricsDocumented).
func TestChartDashboard(t *testing.T) {
	used, raw := dashboardMetrics(t)
	for m := range registeredMetrics(t) {
		if !used[m] {
			t.Errorf("the picker exports %s, which no dashboard panel shows", m)
		}
	}

	objs := render(t, renderArgs{release: "laneway", namespace: "mon", set: []string{"dashboard.enabled=true"}})
	cm := fromUnstructured[corev1.ConfigMap](t, mustFind(t, objs, "ConfigMap", "laneway-dashboard"))
	if cm.Data["laneway-epp.json"] != strings.TrimRight(string(raw), "\n") {
		t.Error("the dashboard ConfigMap does not carry files/dashboard.json unchanged")
	}
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("dashboard labels %v lack the Grafana sidecar's grafana_dashboard=1", cm.Labels)
	}
}

// registeredMetrics returns the metric names internal/metrics, the status
// window (internal/status) and the HA router (internal/epp) register,
// read from the collectors' descriptions (no sample needs to exist).
func registeredMetrics(t testing.TB) map[string]bool {
	t.Helper()
	r := &describeRegisterer{names: map[string]bool{}}
	metrics.New(r, "model")
	// The status window's gauges, which show a sample only once two
	// tenants were backlogged.
	_ = r.Register(status.Collector{T: status.NewTracker()})
	// The HA series exist only with leader election.
	for _, name := range []string{ha.MetricLeader, ha.MetricStreams, ha.MetricTickets, ha.MetricLinks, ha.MetricReoffer} {
		r.names[name] = true
	}
	if len(r.names) == 0 {
		t.Fatal("internal/metrics registered nothing")
	}
	return r.names
}

// describeRegisterer records the names of the collectors registered on it.
type describeRegisterer struct{ names map[string]bool }

var fqNameRe = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *describeRegisterer) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 64)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		if m := fqNameRe.FindStringSubmatch(d.String()); m != nil {
			r.names[m[1]] = true
		}
	}
	return nil
}

func (r *describeRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = r.Register(c)
	}
}

func (r *describeRegisterer) Unregister(prometheus.Collector) bool { return true }

// adminKubeconfig writes a kubeconfig for cfg (the envtest administrator)
// for commands such as helm.
func adminKubeconfig(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "admin"}
	kc.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestChartHelmInstall installs and uninstalls the chart with helm itself
// against the real API server (helm's own CRD handling from crds/, its
// ownership labels, its upgrade path) and checks that the release notes
// tell the user how to send a request in a class.
func TestChartHelmInstall(t *testing.T) {
	cfg := apiServer(t)
	ctx := testContext(t, 3*time.Minute)
	a, err := newApplier(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The InferencePool CRD as a cluster's gateway would have brought it.
	if err := a.applyInferencePoolCRD(ctx); err != nil {
		t.Fatal(err)
	}
	kubeconfig := adminKubeconfig(t, cfg)
	helm := func(args ...string) string {
		t.Helper()
		out, err := run(ctx, "", helmBinary(t), append(args, "--kubeconfig", kubeconfig)...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	values := filepath.Join(chartDir(), "ci", "pool-policy-values.yaml")
	out := helm("install", "lw", chartDir(), "--namespace", "helm-install", "--create-namespace", "-f", values,
		"--set", "inferencePool.installCRD=false", "--set", "envoy.enabled=true")
	for _, want := range []string{
		"STATUS: deployed",
		"InferencePool helm-install/llm",
		"kubectl -n helm-install port-forward service/lw-laneway-envoy 8080:80",
		"curl -sN http://127.0.0.1:8080/v1/completions",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("helm install output lacks %q:\n%s", want, out)
		}
	}
	// Client hints are not trusted by default: the example sends none.
	if strings.Contains(out, "-H 'x-dynamo-meta-policy-class") {
		t.Errorf("helm install output shows a class header, which the chart's Envoy removes:\n%s", out)
	}
	pc := &unstructured.Unstructured{}
	pc.SetAPIVersion(v1alpha1.GroupVersion.String())
	pc.SetKind("PolicyClass")
	pc.SetNamespace("helm-install")
	pc.SetName("llm-premium")
	if err := a.exists(ctx, pc); err != nil {
		t.Errorf("PolicyClass llm-premium after helm install: %v", err)
	}
	out = helm("upgrade", "lw", chartDir(), "--namespace", "helm-install", "-f", values,
		"--set", "inferencePool.installCRD=false", "--set", "envoy.enabled=false", "--set", "epp.replicas=2")
	if !strings.Contains(out, "STATUS: deployed") || !strings.Contains(out, "2 replicas, leader election") {
		t.Errorf("helm upgrade output:\n%s", out)
	}
	helm("uninstall", "lw", "--namespace", "helm-install")

	// With identity, the notes say which client headers Envoy removes and
	// send a token instead of a class header.
	out = helm("install", "lwt", chartDir(), "--namespace", "helm-tenants", "--create-namespace",
		"-f", filepath.Join(chartDir(), "ci", "tenants-values.yaml"), "--set", "inferencePool.name=llmt")
	for _, want := range []string{
		"STATUS: deployed",
		"removes client copies of\nx-tenant-id, x-laneway-tenant, x-laneway-policy-class,",
		`JWT provider "my-provider" then sets the headers`,
		`-H "authorization: Bearer $TOKEN"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("helm install (tenants) output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "x-dynamo-meta-policy-class: ") || strings.Contains(out, "WARNING") {
		t.Errorf("helm install (tenants) output suggests a class header or warns:\n%s", out)
	}
	helm("uninstall", "lwt", "--namespace", "helm-tenants")
}
