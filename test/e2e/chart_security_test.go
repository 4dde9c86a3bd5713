package e2e

import (
	"encoding/json"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"

	"github.com/laneway-dev/laneway/pkg/policy"
)

// TestChartTrustClientHints: by default the picker does not trust a
// client's tenant header and hints (--trust-client-hints=false) and the
// chart's Envoy removes them before ext_proc, identity or not; with
// trustClientHints the picker takes them as sent and Envoy leaves them.
func TestChartTrustClientHints(t *testing.T) {
	tests := []struct {
		name  string
		set   []string
		trust bool
		strip []string // removed by the chart's Envoy; nil: no header_mutation filter
	}{
		{name: "default", set: []string{"envoy.enabled=true"}, strip: append([]string{policy.TenantHeader}, hintHeaders...)},
		{name: "trusted", set: []string{"envoy.enabled=true", "trustClientHints=true"}, trust: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, renderArgs{release: "gw", namespace: "edge", set: tc.set})
			dep := fromUnstructured[appsv1.Deployment](t, mustFind(t, objs, "Deployment", "gw-laneway"))
			want := "--trust-client-hints=false"
			if tc.trust {
				want = "--trust-client-hints=true"
			}
			if args := dep.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, want) {
				t.Errorf("picker args %q lack %s", args, want)
			}
			_, bs := envoyBootstrap(t, objs, "gw-laneway-envoy")
			filters := envoyListeners(t, bs)["inference"].GetHttpFilters()
			if tc.strip == nil {
				if len(filters) != 2 {
					t.Errorf("inference listener filters %v, want ext_proc and router only", filters)
				}
				return
			}
			if len(filters) != 3 || filters[0].GetName() != "envoy.filters.http.header_mutation" {
				t.Fatalf("inference listener filters %v, want header_mutation, ext_proc, router", filters)
			}
			var hm headermutationv3.HeaderMutation
			unpackValid(t, "header_mutation filter", filters[0].GetTypedConfig(), &hm)
			var removed []string
			for _, m := range hm.GetMutations().GetRequestMutations() {
				removed = append(removed, m.GetRemove())
			}
			if !slices.Equal(removed, tc.strip) {
				t.Errorf("removed request headers %v, want %v", removed, tc.strip)
			}
		})
	}
}

// TestChartNetworkPolicy: the picker's pods admit ext_proc streams only
// from the gateway (the chart's Envoy, else networkPolicy.gatewayFrom,
// else the release namespace's pods) and from the picker's own replicas
// (leader forwarding); the health port is open to the kubelet and the
// metrics port to networkPolicy.metricsFrom (anyone when empty).
func TestChartNetworkPolicy(t *testing.T) {
	picker := &metav1.LabelSelector{MatchLabels: map[string]string{
		"app.kubernetes.io/name": "laneway", "app.kubernetes.io/instance": "gw", "app.kubernetes.io/component": "endpoint-picker"}}
	envoy := &metav1.LabelSelector{MatchLabels: map[string]string{
		"app.kubernetes.io/name": "laneway", "app.kubernetes.io/instance": "gw", "app.kubernetes.io/component": "envoy"}}
	gatewayNS := &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "envoy-gateway-system"}}
	prom := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "prometheus"}}
	tests := []struct {
		name    string
		set     []string
		values  string
		none    bool
		gateway []networkingv1.NetworkPolicyPeer // besides the picker's own pods
		metrics []networkingv1.NetworkPolicyPeer
	}{
		{name: "default: the release namespace", gateway: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}},
		{name: "the chart's Envoy", set: []string{"envoy.enabled=true"}, gateway: []networkingv1.NetworkPolicyPeer{{PodSelector: envoy}}},
		{name: "a gateway elsewhere and Prometheus", values: `
networkPolicy:
  gatewayFrom: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: envoy-gateway-system}}}]
  metricsFrom: [{podSelector: {matchLabels: {app: prometheus}}}]
`, gateway: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: gatewayNS}}, metrics: []networkingv1.NetworkPolicyPeer{{PodSelector: prom}}},
		{name: "off", set: []string{"networkPolicy.enabled=false"}, none: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, renderArgs{release: "gw", namespace: "edge", set: tc.set, values: tc.values})
			o := findObject(objs, "NetworkPolicy", "gw-laneway")
			if tc.none {
				if o != nil {
					t.Errorf("a NetworkPolicy with networkPolicy.enabled=false")
				}
				return
			}
			if o == nil {
				t.Fatal("no NetworkPolicy gw-laneway")
			}
			np := fromUnstructured[networkingv1.NetworkPolicy](t, o)
			if !equalJSON(t, np.Spec.PodSelector, *picker) || !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
				t.Errorf("selects %v for %v, want the picker's pods, ingress", np.Spec.PodSelector, np.Spec.PolicyTypes)
			}
			port := func(n int) []networkingv1.NetworkPolicyPort {
				p := intstr.FromInt32(int32(n))
				tcp := corev1.ProtocolTCP
				return []networkingv1.NetworkPolicyPort{{Port: &p, Protocol: &tcp}}
			}
			want := []networkingv1.NetworkPolicyIngressRule{
				{Ports: port(9002), From: append([]networkingv1.NetworkPolicyPeer{{PodSelector: picker}}, tc.gateway...)},
				{Ports: port(9003)},
				{Ports: port(9090), From: tc.metrics},
			}
			if !equalJSON(t, np.Spec.Ingress, want) {
				t.Errorf("ingress %s\nwant %s", toJSON(t, np.Spec.Ingress), toJSON(t, want))
			}
		})
	}
}

// toJSON is v as JSON, for comparing API objects by what they say.
func toJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal %T: %v", v, err)
	}
	return string(b)
}

// equalJSON reports whether a and b marshal alike.
func equalJSON(t *testing.T, a, b any) bool { return toJSON(t, a) == toJSON(t, b) }
