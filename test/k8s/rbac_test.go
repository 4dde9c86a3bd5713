package k8s

import (
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/laneway-dev/laneway/internal/ha"
)

// TestServiceAccountLeastPrivilege asks the API server, as the picker's
// ServiceAccount, what the committed Role allows: what the picker uses in
// its namespace, and nothing in another namespace or cluster-wide.
func TestServiceAccountLeastPrivilege(t *testing.T) {
	e := newEnv(t, false)
	cfg, err := clientcmd.BuildConfigFromFlags("", e.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	sa, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	other := "kube-system"
	tests := []struct {
		ns, group, resource, sub, verb string
		want                           bool
		name                           string // the object's, for rules that name it
	}{
		{e.ns, "", "pods", "", "watch", true, ""},
		{e.ns, "inference.networking.k8s.io", "inferencepools", "", "list", true, ""},
		{e.ns, "laneway.dev", "policyclasses", "", "watch", true, ""},
		{e.ns, "laneway.dev", "policyclasses", "status", "patch", true, ""},
		{e.ns, "laneway.dev", "policyprofiles", "status", "patch", true, ""},
		{e.ns, "coordination.k8s.io", "leases", "", "update", true, ha.LeaseName("pool")},
		{e.ns, "coordination.k8s.io", "leases", "", "get", true, ha.LeaseName("pool")},
		{e.ns, "coordination.k8s.io", "leases", "", "create", true, ""},
		{e.ns, "coordination.k8s.io", "leases", "", "update", false, ha.LeaseName("another-pool")},
		{e.ns, "coordination.k8s.io", "leases", "", "get", false, "kube-controller-manager"},
		{e.ns, "", "events", "", "create", true, ""},

		{e.ns, "", "pods", "", "create", false, ""},
		{e.ns, "", "pods", "", "delete", false, ""},
		{e.ns, "", "secrets", "", "get", false, ""},
		{e.ns, "laneway.dev", "policyclasses", "", "update", false, ""},
		{e.ns, "inference.networking.k8s.io", "inferencepools", "status", "patch", false, ""},
		{e.ns, "coordination.k8s.io", "leases", "", "delete", false, ""},
		{other, "", "pods", "", "list", false, ""},
		{other, "coordination.k8s.io", "leases", "", "get", false, ""},
		{"", "", "pods", "", "list", false, ""}, // all namespaces
		{"", "", "nodes", "", "get", false, ""},
	}
	for _, tt := range tests {
		name := tt.verb + " " + tt.group + "/" + tt.resource
		if tt.sub != "" {
			name += "/" + tt.sub
		}
		if tt.name != "" {
			name += " " + tt.name
		}
		t.Run(name+" in "+tt.ns, func(t *testing.T) {
			r, err := sa.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx(t), &authorizationv1.SelfSubjectAccessReview{
				Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
					Namespace: tt.ns, Group: tt.group, Resource: tt.resource, Subresource: tt.sub, Verb: tt.verb, Name: tt.name,
				}},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("SelfSubjectAccessReview: %v", err)
			}
			if r.Status.Allowed != tt.want {
				t.Errorf("allowed = %v, want %v (%s)", r.Status.Allowed, tt.want, r.Status.Reason)
			}
		})
	}
}
