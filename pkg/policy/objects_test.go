package policy

import (
	"reflect"
	"regexp"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/laneway-dev/laneway/api/v1alpha1"
)

var sampleFiles = []string{
	"policy-cache-buckets.yaml",
	"policy-premium-regular.yaml",
	"policy-single-class.yaml",
	"policy-models.yaml",
	"policy-tenants.yaml",
}

// resolveGrid is a set of requests that exercises every class of the
// samples: every header any sample knows, unknown ones, and bucket edges.
func resolveGrid() (models, headers []string, uncached []uint64) {
	models = []string{"", "other", "meta-llama/Llama-3.1-8B-Instruct"}
	headers = []string{"", "x", "standard", "cached", "uncached", "premium", "regular", "interactive", "background",
		"batch", "gold", "silver", "interactive-short", "background-long", "default"}
	uncached = []uint64{0, 1, 2047, 2048, 3071, 3072, 1 << 30}
	return
}

// TestObjectsRoundTrip converts each sample to objects and back: the model
// must be the same (in canonical form) and resolve every request alike.
func TestObjectsRoundTrip(t *testing.T) {
	for _, name := range sampleFiles {
		t.Run(name, func(t *testing.T) {
			cfg, comp := mustCompileFile(t, name)
			prof, classes := ToObjects(cfg, "llm", "ns")
			if prof == nil {
				t.Fatal("ToObjects returned no PolicyProfile")
			}
			oc := CheckObjects([]v1alpha1.PolicyProfile{*prof}, classes)
			if len(oc.Problems) > 0 {
				t.Fatalf("CheckObjects: %v", oc.Problems)
			}
			if got, want := oc.Config.Canonical(), cfg.Canonical(); !reflect.DeepEqual(got, want) {
				t.Fatalf("round trip changed the model:\n got %+v\nwant %+v", got, want)
			}
			back, err := oc.Config.Compile()
			if err != nil {
				t.Fatal(err)
			}
			models, headers, uncached := resolveGrid()
			for _, m := range models {
				for _, h := range headers {
					for _, u := range uncached {
						a, b := comp.Info[comp.Resolve(m, h, u)], back.Info[back.Resolve(m, h, u)]
						if a != b {
							t.Errorf("Resolve(%q, %q, %d): file %+v, objects %+v", m, h, u, a, b)
						}
					}
				}
			}
		})
	}
}

// TestObjectsRoundTripTenants converts the tenant policy to
// objects and back: the same model in canonical form, the same identity
// source, and every identity gets the same grant and every request the
// same class.
func TestObjectsRoundTripTenants(t *testing.T) {
	cfg, err := LoadYAML([]byte(tenantPolicy))
	if err != nil {
		t.Fatal(err)
	}
	prof, classes := ToObjects(cfg, "llm", "ns")
	if prof.Spec.Identity == nil || len(prof.Spec.Tenants) != 2 || prof.Spec.DefaultTenant == nil {
		t.Fatalf("PolicyProfile lacks the tenant rules: %+v", prof.Spec)
	}
	fair := 0
	for _, c := range classes {
		if c.Spec.TenantFairness {
			fair++
		}
	}
	if fair != 2 {
		t.Errorf("%d tenant-fair PolicyClasses, want 2", fair)
	}
	oc := CheckObjects([]v1alpha1.PolicyProfile{*prof}, classes)
	if len(oc.Problems) > 0 {
		t.Fatalf("CheckObjects: %v", oc.Problems)
	}
	if got, want := oc.Config.Canonical(), cfg.Canonical(); !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip changed the model:\n got %+v\nwant %+v", got, want)
	}
	file, err := cfg.Compile()
	if err != nil {
		t.Fatal(err)
	}
	back, err := oc.Config.Compile()
	if err != nil {
		t.Fatal(err)
	}
	if a, b := file.Identity().String(), back.Identity().String(); a != b {
		t.Errorf("identity: file %q, objects %q", a, b)
	}
	_, headers, uncached := resolveGrid()
	for _, id := range []string{"", "acme", "acme-batch", "acme-x", "acme-y", "globex", "nobody"} {
		a, b := file.Rights(id), back.Rights(id)
		if a.Tenant != b.Tenant || a.CapPriority(1<<30) != b.CapPriority(1<<30) || a.CapStrict(1<<31) != b.CapStrict(1<<31) {
			t.Errorf("Grant(%q): file %+v, objects %+v", id, a.Tenant, b.Tenant)
		}
		for _, h := range headers {
			for _, u := range uncached {
				if x, y := file.Info[file.ResolveFor("", h, u, &a)], back.Info[back.ResolveFor("", h, u, &b)]; x != y {
					t.Errorf("tenant %q header %q uncached %d: file %s, objects %s", id, h, u, x.Name, y.Name)
				}
			}
		}
	}
}

// TestToObjectsTenantsOnly: tenant rules alone (no classes) still make a
// PolicyProfile, since without one the identity would be lost.
func TestToObjectsTenantsOnly(t *testing.T) {
	cfg, err := LoadYAML([]byte("identity: {header: x-tenant-id}\ndefault_tenant: {max_priority: 3}\n"))
	if err != nil {
		t.Fatal(err)
	}
	prof, classes := ToObjects(cfg, "llm", "ns")
	if prof == nil || len(classes) != 0 || prof.Spec.Identity.Header != "x-tenant-id" || *prof.Spec.DefaultTenant.MaxPriority != 3 {
		t.Fatalf("ToObjects = %+v, %d classes", prof, len(classes))
	}
	back, ps := FromObjects([]v1alpha1.PolicyProfile{*prof}, nil)
	if len(ps) > 0 || !reflect.DeepEqual(back.Canonical(), cfg.Canonical()) {
		t.Fatalf("round trip: %+v (problems %v), want %+v", back, ps, cfg)
	}
}

func TestToObjectsShape(t *testing.T) {
	cfg, _ := mustCompileFile(t, "policy-models.yaml")
	prof, classes := ToObjects(cfg, "llm", "prod")
	if prof.Name != "llm" || prof.Namespace != "prod" || prof.Labels[PoolLabel] != "llm" || prof.Kind != KindPolicyProfile ||
		prof.APIVersion != "laneway.dev/v1alpha1" || prof.Spec.PoolRef != (v1alpha1.PoolReference{Group: v1alpha1.DefaultPoolGroup, Name: "llm"}) {
		t.Errorf("profile metadata: %+v %+v", prof.TypeMeta, prof.ObjectMeta)
	}
	if len(classes) != 7 {
		t.Fatalf("%d classes, want 7", len(classes))
	}
	dns := regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`)
	names := map[string]bool{}
	for _, c := range classes {
		if !dns.MatchString(c.Name) || len(c.Name) > 253 {
			t.Errorf("object name %q is not a DNS subdomain", c.Name)
		}
		if names[c.Name] {
			t.Errorf("object name %q used twice", c.Name)
		}
		names[c.Name] = true
	}
	var gold *v1alpha1.PolicyClass
	for i := range classes {
		if classes[i].Spec.ClassName == "gold" {
			gold = &classes[i]
		}
	}
	if gold == nil || gold.Spec.Model != "meta-llama/Llama-3.1-8B-Instruct" || *gold.Spec.PrefillBusyThresholdFrac != "1.5" {
		t.Fatalf("gold class: %+v", gold)
	}
	if !strings.HasPrefix(gold.Name, "llm-meta-llama-llama-3.1-8b-instruct-gold-") {
		t.Errorf("gold object name %q", gold.Name)
	}
	if empty, _ := ToObjects(&Config{}, "llm", ""); empty != nil {
		t.Errorf("ToObjects(empty) = %+v, want no objects", empty)
	}
}

func TestObjectName(t *testing.T) {
	used := map[string]bool{}
	tests := []struct{ pool, model, class, want string }{
		{"llm", "", "premium", "llm-premium"},
		{"llm", "", "Premium", "llm-premium-"}, // lossy: hashed
		{"llm", "", "a_b", "llm-a-b-"},
		{"llm", "", "a.b", "llm-a.b"},
	}
	for _, tt := range tests {
		got := objectName(tt.pool, tt.model, tt.class, used)
		if strings.HasSuffix(tt.want, "-") {
			if !strings.HasPrefix(got, tt.want) || len(got) != len(tt.want)+8 {
				t.Errorf("objectName(%q) = %q, want %q + 8 hex digits", tt.class, got, tt.want)
			}
		} else if got != tt.want {
			t.Errorf("objectName(%q) = %q, want %q", tt.class, got, tt.want)
		}
	}
	// A collision gets a suffix rather than a duplicate.
	u := map[string]bool{"llm-x": true}
	if got := objectName("llm", "", "x", u); got == "llm-x" || !u[got] {
		t.Errorf("colliding name = %q", got)
	}
	if got := objectName("llm", "", strings.Repeat("a", 400), map[string]bool{}); len(got) > 253 {
		t.Errorf("long name has %d bytes", len(got))
	}
}

// pc builds a PolicyClass of pool "llm" for the attribution tests.
func pc(name string, mut func(*v1alpha1.PolicyClassSpec)) v1alpha1.PolicyClass {
	c := v1alpha1.PolicyClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1alpha1.PolicyClassSpec{PoolRef: v1alpha1.PoolReference{Name: "llm"}, Quantum: 1, QueuePolicy: "fcfs"},
	}
	if mut != nil {
		mut(&c.Spec)
	}
	return c
}

func family(f, b string) func(*v1alpha1.PolicyClassSpec) {
	return func(s *v1alpha1.PolicyClassSpec) { s.PolicyFamily, s.CacheBucket = f, b }
}

func profile(name string, family string, buckets ...string) v1alpha1.PolicyProfile {
	p := v1alpha1.PolicyProfile{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1alpha1.PolicyProfileSpec{PoolRef: v1alpha1.PoolReference{Group: v1alpha1.DefaultPoolGroup, Name: "llm"}, DefaultPolicyFamily: family},
	}
	for i, b := range buckets {
		p.Spec.UncachedISLBuckets = append(p.Spec.UncachedISLBuckets, v1alpha1.CacheBucket{Name: b, MinTokens: int64(i * 1000)})
	}
	return p
}

// withTenants applies mut to a profile's spec.
func withTenants(p v1alpha1.PolicyProfile, mut func(*v1alpha1.PolicyProfileSpec)) v1alpha1.PolicyProfile {
	mut(&p.Spec)
	return p
}

// TestCheckObjects checks that cross-object problems carry the YAML
// loader's messages and land on the objects involved.
func TestCheckObjects(t *testing.T) {
	type want struct {
		ref      ObjectRef
		reason   string
		messages string // "" for reasons other than Invalid
	}
	cls := func(n string) ObjectRef { return ObjectRef{KindPolicyClass, n} }
	prf := func(n string) ObjectRef { return ObjectRef{KindPolicyProfile, n} }
	tests := []struct {
		name     string
		profiles []v1alpha1.PolicyProfile
		classes  []v1alpha1.PolicyClass
		want     []want
	}{
		{
			name:     "valid",
			profiles: []v1alpha1.PolicyProfile{profile("llm", "f", "a")},
			classes:  []v1alpha1.PolicyClass{pc("c1", family("f", "a")), pc("c2", nil)},
			want:     []want{{cls("c1"), v1alpha1.ReasonAccepted, ""}, {cls("c2"), v1alpha1.ReasonAccepted, ""}, {prf("llm"), v1alpha1.ReasonAccepted, ""}},
		},
		{
			name:     "family missing a bucket lands on the family's classes",
			profiles: []v1alpha1.PolicyProfile{profile("llm", "f", "a", "b")},
			classes:  []v1alpha1.PolicyClass{pc("fa", family("f", "a")), pc("other", nil)},
			want: []want{
				{cls("fa"), v1alpha1.ReasonInvalid, `policy family "f" has no class for cache bucket "b"`},
				{cls("other"), v1alpha1.ReasonPolicyInvalid, ""},
				{prf("llm"), v1alpha1.ReasonPolicyInvalid, ""},
			},
		},
		{
			name:    "duplicate class name lands on both objects",
			classes: []v1alpha1.PolicyClass{pc("one", func(s *v1alpha1.PolicyClassSpec) { s.ClassName = "gold" }), pc("two", func(s *v1alpha1.PolicyClassSpec) { s.ClassName = "gold" })},
			want: []want{
				{cls("one"), v1alpha1.ReasonInvalid, `class "gold": name is used by more than one class (policy_classes[0] and [1])`},
				{cls("two"), v1alpha1.ReasonInvalid, `class "gold": name is used by more than one class (policy_classes[0] and [1])`},
			},
		},
		{
			name:     "default family naming no family lands on the profile",
			profiles: []v1alpha1.PolicyProfile{profile("llm", "premium", "all")},
			classes:  []v1alpha1.PolicyClass{pc("regular", family("regular", "all"))},
			want: []want{
				{prf("llm"), v1alpha1.ReasonInvalid, `default_policy_family "premium" names no policy family (families: regular)`},
				{cls("regular"), v1alpha1.ReasonPolicyInvalid, ""},
			},
		},
		{
			name:    "families without a PolicyProfile",
			classes: []v1alpha1.PolicyClass{pc("gold", family("gold", "all"))},
			want:    []want{{cls("gold"), v1alpha1.ReasonInvalid, `class "gold": names a policy family, so default_policy_family and uncached_isl_buckets are required`}},
		},
		{
			name:     "unknown bucket and explicit name equal to a family",
			profiles: []v1alpha1.PolicyProfile{profile("llm", "f", "a")},
			classes: []v1alpha1.PolicyClass{
				pc("fa", family("f", "a")), pc("fx", family("f", "x")), pc("f", nil),
			},
			want: []want{
				{cls("fx"), v1alpha1.ReasonInvalid, `class "fx": cache_bucket "x" is not a bucket of uncached_isl_buckets (a)`},
				{cls("f"), v1alpha1.ReasonInvalid, `class "f": explicit class name equals policy family "f"; a class header naming it would be ambiguous`},
				{cls("fa"), v1alpha1.ReasonPolicyInvalid, ""},
			},
		},
		{
			name:     "a second PolicyProfile is refused",
			profiles: []v1alpha1.PolicyProfile{profile("b-second", ""), profile("a-first", "")},
			classes:  []v1alpha1.PolicyClass{pc("c", nil)},
			want: []want{
				{prf("b-second"), v1alpha1.ReasonInvalid, `PolicyProfile "b-second": the pool already has PolicyProfile "a-first"; a pool has at most one, so this one is ignored until it is deleted`},
				{prf("a-first"), v1alpha1.ReasonPolicyInvalid, ""},
			},
		},
		{
			name:    "objects of another pool",
			classes: []v1alpha1.PolicyClass{pc("a", nil), pc("b", func(s *v1alpha1.PolicyClassSpec) { s.PoolRef.Name = "other" })},
			want: []want{
				{cls("b"), v1alpha1.ReasonInvalid, `PolicyClass "b": poolRef names pool inference.networking.k8s.io/other, but other objects of this policy name inference.networking.k8s.io/llm`},
			},
		},
		{
			name: "unparsable decimal string",
			classes: []v1alpha1.PolicyClass{pc("a", func(s *v1alpha1.PolicyClassSpec) {
				s.PrefillBusyThresholdFrac = ptr("lots")
			})},
			want: []want{{cls("a"), v1alpha1.ReasonInvalid, `PolicyClass "a": prefillBusyThresholdFrac "lots" is not a decimal number: strconv.ParseFloat: parsing "lots": invalid syntax`}},
		},
		{
			name: "tenant rules are judged with the classes and land on the profile",
			profiles: []v1alpha1.PolicyProfile{withTenants(profile("llm", ""), func(s *v1alpha1.PolicyProfileSpec) {
				s.Tenants = []v1alpha1.TenantBinding{{Name: "acme", Match: v1alpha1.TenantMatch{Exact: []string{"acme"}},
					TenantRights: v1alpha1.TenantRights{Allowed: []string{"gold"}, DefaultFamily: "gold"}}}
			})},
			classes: []v1alpha1.PolicyClass{pc("silver", nil)},
			want: []want{
				{prf("llm"), v1alpha1.ReasonInvalid, `tenant "acme": allowed "gold" names no policy family or explicit class` + "\n" +
					`tenant "acme": default_family "gold" names no policy family or explicit class`},
				{cls("silver"), v1alpha1.ReasonPolicyInvalid, ""},
			},
		},
		{
			name: "a binding naming a class that exists is valid",
			profiles: []v1alpha1.PolicyProfile{withTenants(profile("llm", ""), func(s *v1alpha1.PolicyProfileSpec) {
				s.Identity = &v1alpha1.Identity{Header: "x-tenant-id"}
				s.DefaultTenant = &v1alpha1.TenantRights{Allowed: []string{"silver"}, DefaultFamily: "silver"}
			})},
			classes: []v1alpha1.PolicyClass{pc("silver", func(s *v1alpha1.PolicyClassSpec) { s.TenantFairness = true })},
			want:    []want{{prf("llm"), v1alpha1.ReasonAccepted, ""}, {cls("silver"), v1alpha1.ReasonAccepted, ""}},
		},
		{
			name:     "maxTenants without tenantFairness lands on the class",
			profiles: []v1alpha1.PolicyProfile{profile("llm", "")},
			classes:  []v1alpha1.PolicyClass{pc("silver", func(s *v1alpha1.PolicyClassSpec) { s.MaxTenants = ptr[int64](5) })},
			want: []want{
				{cls("silver"), v1alpha1.ReasonInvalid, `class "silver": max_tenants is set without tenant_fairness`},
				{prf("llm"), v1alpha1.ReasonPolicyInvalid, ""},
			},
		},
		{
			name:     "model profile problems carry the model",
			profiles: []v1alpha1.PolicyProfile{profile("llm", "")},
			classes: []v1alpha1.PolicyClass{pc("root", nil), pc("m", func(s *v1alpha1.PolicyClassSpec) {
				s.Model, s.BusyWorkerRatio = "llama", ptr("0.5")
			})},
			want: []want{
				{cls("m"), v1alpha1.ReasonInvalid, `model "llama": class "m": busy_worker_ratio is set without a threshold: set prefill_busy_threshold or prefill_busy_threshold_frac`},
				{cls("root"), v1alpha1.ReasonPolicyInvalid, ""},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			oc := CheckObjects(tt.profiles, tt.classes)
			if valid := len(oc.Problems) == 0; valid != (oc.Config != nil) {
				t.Errorf("Config = %v with %d problems", oc.Config, len(oc.Problems))
			}
			for _, w := range tt.want {
				c := oc.AcceptedCondition(w.ref, 7)
				if c.Type != v1alpha1.ConditionAccepted || c.Reason != w.reason || c.ObservedGeneration != 7 {
					t.Errorf("%v: condition %+v, want reason %s", w.ref, c, w.reason)
				}
				wantStatus := metav1.ConditionFalse
				if w.reason == v1alpha1.ReasonAccepted {
					wantStatus = metav1.ConditionTrue
				}
				if c.Status != wantStatus {
					t.Errorf("%v: status %s, want %s", w.ref, c.Status, wantStatus)
				}
				if w.messages != "" && c.Message != w.messages {
					t.Errorf("%v: message\n got %q\nwant %q", w.ref, c.Message, w.messages)
				}
			}
		})
	}
}

func TestSetAccepted(t *testing.T) {
	oc := CheckObjects(nil, []v1alpha1.PolicyClass{pc("a", nil)})
	var conds []metav1.Condition
	oc.SetAccepted(&conds, ObjectRef{KindPolicyClass, "a"}, 3)
	if len(conds) != 1 || conds[0].Status != metav1.ConditionTrue || conds[0].LastTransitionTime.IsZero() {
		t.Fatalf("conditions = %+v", conds)
	}
	first := conds[0].LastTransitionTime
	oc.SetAccepted(&conds, ObjectRef{KindPolicyClass, "a"}, 4)
	if len(conds) != 1 || conds[0].LastTransitionTime != first || conds[0].ObservedGeneration != 4 {
		t.Errorf("unchanged status moved the transition time: %+v", conds)
	}
}

func TestFromObjectsDefaults(t *testing.T) {
	// className defaults to metadata.name, queuePolicy to edf; classes are
	// ordered by class name, so the implicit default is the first by name.
	cfg, ps := FromObjects(nil, []v1alpha1.PolicyClass{
		pc("zeta", func(s *v1alpha1.PolicyClassSpec) { s.QueuePolicy = "" }),
		pc("alpha", nil),
	})
	if len(ps) > 0 {
		t.Fatal(ps)
	}
	if got := cfg.Root.Classes; len(got) != 2 || got[0].Name != "alpha" || got[1].Name != "zeta" || got[1].QueuePolicy != "edf" {
		t.Fatalf("classes = %+v", got)
	}
	comp, err := cfg.Compile()
	if err != nil {
		t.Fatal(err)
	}
	if got := comp.Info[comp.Resolve("", "", 1)].Name; got != "alpha" {
		t.Errorf("default class = %q, want alpha", got)
	}
}

// TestDisaggregationRoundTrip: disaggregate_above_uncached_tokens goes to
// the PolicyClass field disaggregateAboveUncachedTokens and back, and
// compiles to the class's threshold (unset: the pool's default applies).
func TestDisaggregationRoundTrip(t *testing.T) {
	cfg, err := LoadYAML([]byte("policy_classes:\n  - {name: long, quantum: 1, disaggregate_above_uncached_tokens: 512}\n  - {name: rest, quantum: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	prof, classes := ToObjects(cfg, "llm", "ns")
	for _, c := range classes {
		if got := c.Spec.DisaggregateAboveUncachedTokens; (c.Spec.ClassName == "long") != (got != nil && *got == 512) {
			t.Errorf("class %s: disaggregateAboveUncachedTokens = %v", c.Spec.ClassName, got)
		}
	}
	oc := CheckObjects([]v1alpha1.PolicyProfile{*prof}, classes)
	if len(oc.Problems) > 0 {
		t.Fatal(oc.Problems)
	}
	if got, want := oc.Config.Canonical(), cfg.Canonical(); !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip changed the model:\n got %+v\nwant %+v", got, want)
	}
	comp, err := oc.Config.Compile()
	if err != nil {
		t.Fatal(err)
	}
	for i, in := range comp.Info {
		want := Disaggregation{}
		if in.Name == "long" {
			want = Disaggregation{AboveUncached: 512, Set: true}
		}
		if got := comp.Disaggregate[i]; got != want {
			t.Errorf("class %s: Disaggregate = %+v, want %+v", in.Name, got, want)
		}
	}
}
