package policy

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/laneway-dev/laneway/pkg/drr"
)

// tenantPolicy is the example: premium and regular families over
// two buckets, identity from a header and a JWT claim, two bindings.
const tenantPolicy = `
identity:
  header: x-tenant-id
  metadata:
    namespace: envoy.filters.http.jwt_authn
    path: [my-provider, sub]
  anonymous: nobody
tenants:
  - name: acme
    match: {exact: [acme, acme-batch], prefix: [acme-]}
    allowed: [premium, regular]
    default_family: regular
    weight: 3
    max_priority: 10
    max_strict_priority: 1
    request_queue_limit: 500
    raw_isl_token_queue_limit: 2000000
  - name: acme-x
    match: {exact: [acme-x]}
    allowed: [premium]
    default_family: premium
default_tenant:
  allowed: [regular]
  default_family: regular
default_policy_family: regular
uncached_isl_buckets:
  - {min_tokens: 0, bucket: short}
  - {min_tokens: 3072, bucket: long}
policy_classes:
  - {name: premium-short, policy_family: premium, cache_bucket: short, quantum: 512, prefill_busy_threshold: 1536}
  - {name: premium-long, policy_family: premium, cache_bucket: long, quantum: 512, prefill_busy_threshold: 1536}
  - {name: regular-short, policy_family: regular, cache_bucket: short, quantum: 128, prefill_busy_threshold: 1536, tenant_fairness: true}
  - {name: regular-long, policy_family: regular, cache_bucket: long, quantum: 128, prefill_busy_threshold: 1536, tenant_fairness: true, max_tenants: 50}
`

func compileYAML(t *testing.T, src string) *Compiled {
	t.Helper()
	cfg, err := LoadYAML([]byte(src))
	if err != nil {
		t.Fatalf("LoadYAML: %v", err)
	}
	c, err := cfg.Compile()
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	return c
}

func TestTenantGrants(t *testing.T) {
	c := compileYAML(t, tenantPolicy)
	if id := c.Identity(); id == nil || id.Header != "x-tenant-id" || id.MetadataNamespace != "envoy.filters.http.jwt_authn" ||
		strings.Join(id.MetadataPath, ".") != "my-provider.sub" || id.AnonymousTenant() != "nobody" {
		t.Fatalf("identity %+v", c.Identity())
	}
	cases := []struct {
		id        string
		tenant    drr.Tenant
		binding   string
		prio, str int64 // capped values of hints 100 and 5
	}{
		{"acme", drr.Tenant{Name: "acme", Weight: 3, RequestLimit: 500, RawISLLimit: 2_000_000}, "acme", 10, 1},
		{"acme-batch", drr.Tenant{Name: "acme", Weight: 3, RequestLimit: 500, RawISLLimit: 2_000_000}, "acme", 10, 1},
		// acme's prefix comes first in the file, so it wins over the later
		// exact binding.
		{"acme-x", drr.Tenant{Name: "acme", Weight: 3, RequestLimit: 500, RawISLLimit: 2_000_000}, "acme", 10, 1},
		{"globex", drr.Tenant{Name: "globex", Weight: 1}, "", 0, 0},
		{"", drr.Tenant{Name: "nobody", Weight: 1}, "", 0, 0},
	}
	for _, tc := range cases {
		g := c.Rights(tc.id)
		if g.Tenant != tc.tenant || g.Binding == nil || g.Binding.Name != tc.binding {
			t.Errorf("Grant(%q) = %+v (binding %+v), want %+v in binding %q", tc.id, g.Tenant, g.Binding, tc.tenant, tc.binding)
		}
		if p, s := g.CapPriority(100), g.CapStrict(5); int64(p) != tc.prio || int64(s) != tc.str {
			t.Errorf("Grant(%q) caps hints 100/5 to %d/%d, want %d/%d", tc.id, p, s, tc.prio, tc.str)
		}
	}
}

func TestResolveForAllowedClasses(t *testing.T) {
	c := compileYAML(t, tenantPolicy)
	idx := func(name string) int { return c.Index("", name) }
	acme, other := c.Rights("acme"), c.Rights("globex")
	cases := []struct {
		g        TenantRights
		header   string
		uncached uint64
		want     string
	}{
		{acme, "premium", 100, "premium-short"},
		{acme, "premium", 5000, "premium-long"},
		{acme, "", 100, "regular-short"},         // its default family
		{acme, "nonsense", 100, "regular-short"}, // unknown: its default family
		{other, "premium", 100, "regular-short"}, // not allowed: ignored
		{other, "premium", 4000, "regular-long"},
		{other, "regular", 100, "regular-short"},
		{TenantRights{}, "premium", 100, "premium-short"}, // no rules
	}
	for _, tc := range cases {
		if got := c.ResolveFor("", tc.header, tc.uncached, &tc.g); got != idx(tc.want) {
			t.Errorf("tenant %q header %q uncached %d: class %s, want %s", tc.g.Name, tc.header, tc.uncached, c.Info[got].Name, tc.want)
		}
	}
	if c.Classes[idx("regular-short")].MaxTenants != DefaultMaxTenants || c.Classes[idx("regular-long")].MaxTenants != 50 ||
		!c.Classes[idx("regular-long")].TenantFairness || c.Classes[idx("premium-short")].TenantFairness {
		t.Errorf("tenant fairness settings not compiled: %+v", c.Classes)
	}
}

// TestOneAllowedIsTheDefault: allowed with one entry and no
// default_family defaults to that entry (the audit's default_tenant:
// {allowed: [std]} was refused for lacking a default it could only have
// one value for).
func TestOneAllowedIsTheDefault(t *testing.T) {
	c := compileYAML(t, `
policy_classes:
  - {name: std, quantum: 1, prefill_busy_threshold: 10}
  - {name: gold, quantum: 1, prefill_busy_threshold: 10}
default_tenant: {allowed: [std]}
`)
	g := c.Rights("anyone")
	for _, header := range []string{"", "gold", "nonsense"} {
		if got := c.ResolveFor("", header, 100, &g); got != c.Index("", "std") {
			t.Errorf("header %q: class %s, want std", header, c.Info[got].Name)
		}
	}
}

// TestNoIdentityTrustsHints: without an identity source, hints are not
// capped and no tenant is tracked unless a class is tenant-fair.
func TestNoIdentityTrustsHints(t *testing.T) {
	c := compileYAML(t, `
policy_classes:
  - {name: a, quantum: 1, prefill_busy_threshold: 10}
`)
	g := c.Rights("someone")
	if g.Name != "" || g.CapPriority(1<<30) != 1<<30 || g.CapStrict(1<<31) != 1<<31 {
		t.Fatalf("grant without identity or tenant rules: %+v caps %d %d", g.Tenant, g.CapPriority(1<<30), g.CapStrict(1<<31))
	}
	if c.Identity() != nil {
		t.Fatal("identity where none is configured")
	}
	fair := compileYAML(t, `
policy_classes:
  - {name: a, quantum: 1, prefill_busy_threshold: 10, tenant_fairness: true}
`)
	if g := fair.Rights("x"); g.Name != "x" || g.Weight != 1 {
		t.Fatalf("tenant-fair class without identity: grant %+v, want tenant x", g.Tenant)
	}
	if g := fair.Rights(""); g.Name != DefaultAnonymousTenant {
		t.Fatalf("no tenant header: %q, want %q", g.Name, DefaultAnonymousTenant)
	}
}

func TestTenantValidation(t *testing.T) {
	base := `
policy_classes:
  - {name: a, quantum: 1, prefill_busy_threshold: 10}
  - {name: b, quantum: 1, prefill_busy_threshold: 10}
`
	cases := []struct {
		name, yaml, want string
	}{
		{"identity without source", "identity: {anonymous: x}", "identity: set header, metadata, or both"},
		{"upper-case header", "identity: {header: X-Tenant}", `identity.header "X-Tenant" must be a lower-case header name`},
		{"header with a slash", "identity: {header: x/tenant}", `identity.header "x/tenant" must be a lower-case header name`},
		{"namespace without path", "identity: {metadata: {namespace: ns}}", "identity.metadata: namespace and path go together"},
		{"unnamed binding", "tenants: [{match: {exact: [x]}}]", "tenants[0]: name is required"},
		{"no match", "tenants: [{name: x}]", `tenant "x": match needs at least one exact value or prefix`},
		{"duplicate", "tenants: [{name: x, match: {exact: [x]}}, {name: x, match: {exact: [y]}}]", `tenant "x": name is used by more than one binding`},
		{"empty prefix", `tenants: [{name: x, match: {prefix: [""]}}]`, `would match every identity`},
		{"unknown allowed", "tenants: [{name: x, match: {exact: [x]}, allowed: [c], default_family: a}]", `allowed "c" names no policy family or explicit class`},
		{"allowed without default", "default_tenant: {allowed: [a, b]}", "default_tenant: allowed has 2 entries, so default_family is required"},
		{"default outside allowed", "default_tenant: {allowed: [a], default_family: b}", `default_family "b" is not in allowed [a]`},
		{"weight 0", "default_tenant: {weight: 0}", "weight must be between 1 and 1000000"},
		{"limit 0", "default_tenant: {request_queue_limit: 0}", "request_queue_limit must be >= 1"},
		{"negative cap", "default_tenant: {max_priority: -1}", "max_priority must be >= 0"},
		{"unknown key", "default_tenant: {name: x}", `unknown key "name"`},
		{"max_tenants alone", "", "max_tenants is set without tenant_fairness"},
	}
	for _, tc := range cases {
		src := tc.yaml + "\n" + base
		if tc.name == "max_tenants alone" {
			src = "policy_classes:\n  - {name: a, quantum: 1, max_tenants: 3}\n"
		}
		_, err := LoadYAML([]byte(src))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

// TestBindingsKnowModelProfiles: bindings apply to every model profile, so
// a class that only a model profile has is a valid grant, as long as
// every profile a request can resolve in (the root and each model's) has
// some class the binding allows: a request for a model is resolved in its
// model's profile only, and one with no allowed class could serve the
// tenant only outside allowed (issue 22).
func TestBindingsKnowModelProfiles(t *testing.T) {
	cases := []struct {
		name, src, wantErr string
	}{
		{name: "a model profile's class, and one of the root's", src: `
tenants:
  - {name: x, match: {exact: [x]}, allowed: [gold, silver], default_family: silver}
policy_classes:
  - {name: silver, quantum: 1}
models:
  m:
    policy_classes:
      - {name: gold, quantum: 1, prefill_busy_threshold: 10}
`},
		{name: "only a model profile's class: the root has none", src: `
tenants:
  - {name: x, match: {exact: [x]}, allowed: [gold], default_family: gold}
models:
  m:
    policy_classes:
      - {name: gold, quantum: 1, prefill_busy_threshold: 10}
`, wantErr: `tenant "x": allowed [gold] names no class of the root profile (its classes: default)`},
		{name: "a model profile without the binding's class", src: `
default_tenant: {allowed: [regular], default_family: regular}
policy_classes:
  - {name: regular, quantum: 1}
models:
  special:
    policy_classes:
      - {name: premium, quantum: 1}
`, wantErr: `default_tenant: allowed [regular] names no class of model "special" (its classes: premium)`},
	}
	for _, tc := range cases {
		_, err := LoadYAML([]byte(tc.src))
		if (err != nil) != (tc.wantErr != "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.wantErr)
		}
	}
}

// TestResolveStaysInsideAllowed: a binding's request is resolved inside
// its allowed classes in every profile, also when the model's profile
// lacks the binding's default family and its own default is not allowed:
// the first allowed class the profile has. Before, a class header or the
// profile's default could land it outside (issue 22).
func TestResolveStaysInsideAllowed(t *testing.T) {
	cfg, err := LoadYAML([]byte(`
identity: {header: x-tenant-id}
default_tenant: {allowed: [regular, bronze], default_family: regular}
default_policy_family: regular
uncached_isl_buckets: [{min_tokens: 0, bucket: all}]
policy_classes:
  - {name: premium, policy_family: premium, cache_bucket: all, quantum: 1}
  - {name: regular, policy_family: regular, cache_bucket: all, quantum: 1}
models:
  special:
    policy_classes:
      - {name: premium, quantum: 1}
      - {name: bronze, quantum: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	c, err := cfg.Compile()
	if err != nil {
		t.Fatal(err)
	}
	rights := c.Rights("")
	for _, tc := range []struct{ model, header, want string }{
		{"", "", "regular"},
		{"", "premium", "regular"},
		{"special", "", "special/bronze"},
		{"special", "premium", "special/bronze"},
		{"special", "bronze", "special/bronze"},
	} {
		i := c.ResolveFor(tc.model, tc.header, 0, &rights)
		if got := c.Classes[i].Name; got != tc.want {
			t.Errorf("model %q, header %q: class %s, want %s", tc.model, tc.header, got, tc.want)
		}
	}
}

// TestHeaderNameRuleIsTheCRDs: the loader's header-name rule is the
// pattern the PolicyProfile CRD validates identity.header with, so what
// laneway validate accepts the API server accepts too.
func TestHeaderNameRuleIsTheCRDs(t *testing.T) {
	crd, err := os.ReadFile("../../config/crd/bases/laneway.dev_policyprofiles.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if want := "pattern: " + HeaderNamePattern + "\n"; !strings.Contains(string(crd), want) {
		t.Errorf("the PolicyProfile CRD has no %q: the loader and the CRD disagree on header names", strings.TrimSpace(want))
	}
}

// TestEmptyPolicyClassesIsAnError: policy_classes: [] is refused, as the
// reference router refuses it, at the root and in a model profile; leaving
// the key out is the synthetic class.
func TestEmptyPolicyClassesIsAnError(t *testing.T) {
	for _, src := range []string{"policy_classes: []\n", "models:\n  m:\n    policy_classes: []\n"} {
		_, err := LoadYAML([]byte(src))
		var ps Problems
		if !errors.As(err, &ps) || !ps.Has(RuleEmptyClasses) {
			t.Errorf("%q: error %v, want an EmptyClasses problem", src, err)
		}
	}
	if _, err := LoadYAML([]byte("default_policy_class: \n")); err != nil {
		t.Errorf("no policy_classes key: %v, want the synthetic class", err)
	}
}
