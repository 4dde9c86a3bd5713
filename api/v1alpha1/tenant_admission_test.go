package v1alpha1_test

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/laneway-dev/laneway/api/v1alpha1"
)

// tenantProfile is the example tenant rules on a PolicyProfile:
// identity from a JWT claim, then a header; two bindings; a default.
func tenantProfile(ns string) *v1alpha1.PolicyProfile {
	return &v1alpha1.PolicyProfile{
		ObjectMeta: metav1.ObjectMeta{Name: "llm", Namespace: ns},
		Spec: v1alpha1.PolicyProfileSpec{
			PoolRef: v1alpha1.PoolReference{Name: "llm"},
			Identity: &v1alpha1.Identity{
				Header:    "x-tenant-id",
				Metadata:  &v1alpha1.IdentityMetadata{Namespace: "envoy.filters.http.jwt_authn", Path: []string{"my-provider", "sub"}},
				Anonymous: "nobody",
			},
			Tenants: []v1alpha1.TenantBinding{
				{
					Name:  "acme",
					Match: v1alpha1.TenantMatch{Exact: []string{"acme", "acme-batch"}, Prefix: []string{"acme-"}},
					TenantRights: v1alpha1.TenantRights{
						Allowed: []string{"premium", "regular"}, DefaultFamily: "regular", Weight: ptr[int64](3),
						MaxPriority: ptr[int64](10), MaxStrictPriority: ptr[int64](1),
						RequestQueueLimit: ptr[int64](500), RawISLTokenQueueLimit: ptr[int64](2_000_000),
					},
				},
				{
					Name:         "acme-x",
					Match:        v1alpha1.TenantMatch{Exact: []string{"acme-x"}},
					TenantRights: v1alpha1.TenantRights{Allowed: []string{"premium"}, DefaultFamily: "premium"},
				},
			},
			DefaultTenant: &v1alpha1.TenantRights{Allowed: []string{"regular"}, DefaultFamily: "regular"},
		},
	}
}

// TestTenantAdmission checks the per-object tenant rules: the bounds of
// pkg/policy's validateBinding and the identity rules, each refused with
// a message naming the field.
func TestTenantAdmission(t *testing.T) {
	needAPIServer(t)
	ns := namespace(t)
	tests := []struct {
		name string
		mut  func(*v1alpha1.PolicyProfileSpec)
		want []string
	}{
		{"identity without a source", func(s *v1alpha1.PolicyProfileSpec) { s.Identity = &v1alpha1.Identity{Anonymous: "x"} },
			[]string{"spec.identity", "identity needs a source: set header, metadata, or both"}},
		{"upper-case header", func(s *v1alpha1.PolicyProfileSpec) { s.Identity.Header = "X-Tenant-Id" },
			[]string{`spec.identity.header: Invalid value: "X-Tenant-Id"`, "should match"}},
		{"header with a colon", func(s *v1alpha1.PolicyProfileSpec) { s.Identity.Header = "x:y" },
			[]string{"spec.identity.header", "should match"}},
		{"metadata without path", func(s *v1alpha1.PolicyProfileSpec) { s.Identity.Metadata.Path = nil },
			[]string{"spec.identity.metadata.path: Required value"}},
		{"metadata path with an empty key", func(s *v1alpha1.PolicyProfileSpec) { s.Identity.Metadata.Path = []string{"p", ""} },
			[]string{"spec.identity.metadata.path[1]", "should be at least 1 chars long"}},
		{"metadata without namespace", func(s *v1alpha1.PolicyProfileSpec) { s.Identity.Metadata.Namespace = "" },
			[]string{"spec.identity.metadata.namespace", "should be at least 1 chars long"}},
		{"binding without name", func(s *v1alpha1.PolicyProfileSpec) { s.Tenants[1].Name = "" },
			[]string{"spec.tenants[1].name", "should be at least 1 chars long"}},
		{"binding names repeat", func(s *v1alpha1.PolicyProfileSpec) { s.Tenants[1].Name = "acme" },
			[]string{"spec.tenants[1]: Duplicate value"}},
		{"match with nothing", func(s *v1alpha1.PolicyProfileSpec) { s.Tenants[1].Match = v1alpha1.TenantMatch{} },
			[]string{"spec.tenants[1].match", "match needs at least one exact value or prefix"}},
		{"empty prefix", func(s *v1alpha1.PolicyProfileSpec) { s.Tenants[0].Match.Prefix = []string{""} },
			[]string{"spec.tenants[0].match.prefix[0]", "should be at least 1 chars long"}},
		{"binding allowed without default", func(s *v1alpha1.PolicyProfileSpec) {
			s.Tenants[1].DefaultFamily, s.Tenants[1].Allowed = "", []string{"regular", "premium"}
		},
			[]string{"spec.tenants[1]", "allowed has more than one entry, so defaultFamily is required"}},
		{"default tenant allowed without default", func(s *v1alpha1.PolicyProfileSpec) {
			s.DefaultTenant.DefaultFamily, s.DefaultTenant.Allowed = "", []string{"regular", "premium"}
		},
			[]string{"spec.defaultTenant", "allowed has more than one entry, so defaultFamily is required"}},
		{"weight 0", func(s *v1alpha1.PolicyProfileSpec) { s.Tenants[0].Weight = ptr[int64](0) },
			[]string{"spec.tenants[0].weight", "should be greater than or equal to 1"}},
		{"weight above a million", func(s *v1alpha1.PolicyProfileSpec) { s.DefaultTenant.Weight = ptr[int64](1_000_001) },
			[]string{"spec.defaultTenant.weight", "should be less than or equal to 1000000"}},
		{"negative priority cap", func(s *v1alpha1.PolicyProfileSpec) { s.Tenants[0].MaxPriority = ptr[int64](-1) },
			[]string{"spec.tenants[0].maxPriority", "should be greater than or equal to 0"}},
		{"priority cap beyond int32", func(s *v1alpha1.PolicyProfileSpec) { s.Tenants[0].MaxPriority = ptr[int64](1 << 31) },
			[]string{"spec.tenants[0].maxPriority", "should be less than or equal to 2147483647"}},
		{"strict cap beyond uint32", func(s *v1alpha1.PolicyProfileSpec) { s.DefaultTenant.MaxStrictPriority = ptr[int64](1 << 32) },
			[]string{"spec.defaultTenant.maxStrictPriority", "should be less than or equal to 4294967295"}},
		{"request limit 0", func(s *v1alpha1.PolicyProfileSpec) { s.Tenants[0].RequestQueueLimit = ptr[int64](0) },
			[]string{"spec.tenants[0].requestQueueLimit", "should be greater than or equal to 1"}},
		{"token limit 0", func(s *v1alpha1.PolicyProfileSpec) { s.DefaultTenant.RawISLTokenQueueLimit = ptr[int64](0) },
			[]string{"spec.defaultTenant.rawISLTokenQueueLimit", "should be greater than or equal to 1"}},
		{"empty allowed entry", func(s *v1alpha1.PolicyProfileSpec) { s.Tenants[0].Allowed = []string{"premium", ""} },
			[]string{"spec.tenants[0].allowed[1]", "should be at least 1 chars long"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obj := tenantProfile(ns)
			tt.mut(&obj.Spec)
			mustRefuse(t, obj, obj.Spec, tt.want)
		})
	}

	// The example is admitted whole, including the extreme caps, and
	// metadata-only or header-only identities are enough.
	ok := tenantProfile(ns)
	ok.Spec.Tenants[1].MaxPriority, ok.Spec.Tenants[1].MaxStrictPriority = ptr[int64](1<<31-1), ptr[int64](1<<32-1)
	if err := k8s.Create(context.Background(), ok); err != nil {
		t.Fatalf("valid tenant rules refused: %v", err)
	}
	if got := ok.Spec.Tenants[0]; got.Name != "acme" || *got.Weight != 3 || got.Match.Prefix[0] != "acme-" || ok.Spec.Identity.Metadata.Path[1] != "sub" {
		t.Errorf("values changed on admission: %+v", ok.Spec)
	}
	for i, id := range []*v1alpha1.Identity{
		{Header: "x-tenant-id"},
		{Metadata: &v1alpha1.IdentityMetadata{Namespace: "ns", Path: []string{"sub"}}},
	} {
		p := tenantProfile(ns)
		p.Name = []string{"header-only", "metadata-only"}[i]
		p.Spec.Identity = id
		if err := k8s.Create(context.Background(), p); err != nil {
			t.Errorf("identity %+v refused: %v", id, err)
		}
	}
}

// TestTenantPrinterColumns: a PolicyProfile shows where identity comes
// from and how many bindings are in force (status, written by the
// picker), and a PolicyClass shows its tenant fairness in the wide view.
func TestTenantPrinterColumns(t *testing.T) {
	needAPIServer(t)
	ctx := context.Background()
	ns := namespace(t)
	prof := tenantProfile(ns)
	if err := k8s.Create(ctx, prof); err != nil {
		t.Fatal(err)
	}
	prof.Status.Identity = "metadata envoy.filters.http.jwt_authn/my-provider.sub, then header x-tenant-id"
	prof.Status.TenantBindings = 2
	if err := k8s.Status().Update(ctx, prof); err != nil {
		t.Fatalf("status update: %v", err)
	}
	checkTable(t, ns, "policyprofiles",
		[]string{"Name", "Pool", "Default Family", "Identity", "Tenants", "Accepted", "Age"},
		map[string]any{"Name": "llm", "Pool": "llm", "Identity": prof.Status.Identity, "Tenants": float64(2)})

	pc := validClass(ns, "regular")
	pc.Spec.TenantFairness, pc.Spec.MaxTenants = true, ptr[int64](50)
	if err := k8s.Create(ctx, pc); err != nil {
		t.Fatal(err)
	}
	checkTable(t, ns, "policyclasses",
		[]string{"Name", "Family", "Bucket", "Policy", "Quantum", "Threshold", "Accepted", "Pending", "Age"},
		map[string]any{"Name": "regular", "Tenant Fair": true, "Max Tenants": float64(50)})
}
