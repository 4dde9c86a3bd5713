package policy

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strconv"
	"strings"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/laneway-dev/laneway/api/v1alpha1"
)

// Object kinds, as ObjectRef.Kind spells them.
const (
	KindPolicyClass   = "PolicyClass"
	KindPolicyProfile = "PolicyProfile"
)

// PoolLabel is the label ToObjects puts on every object, so that
// `kubectl get policyclasses -l laneway.dev/pool=NAME` lists one pool's.
const PoolLabel = "laneway.dev/pool"

// ObjectRef names one policy object of a pool (all are in the pool's
// namespace).
type ObjectRef struct {
	Kind string
	Name string
}

// ObjectCheck is the verdict on one pool's policy objects: the Config they
// make when valid, and otherwise every problem, attributed to the objects
// that cause it, for their Accepted conditions.
type ObjectCheck struct {
	// Config is the pool's policy; nil when Problems is not empty.
	Config *Config
	// Problems is every problem, in a stable order.
	Problems Problems
	// byObject maps an object to the indexes of its problems.
	byObject map[ObjectRef][]int
}

// ProblemsFor returns the problems attributed to one object.
func (oc *ObjectCheck) ProblemsFor(ref ObjectRef) Problems {
	var out Problems
	for _, i := range oc.byObject[ref] {
		out = append(out, oc.Problems[i])
	}
	return out
}

// AcceptedCondition is the Accepted condition for one object of the pool:
// True when the pool's policy is valid; False with reason Invalid and every
// problem of the object (one per line) when the object breaks a rule; False
// with reason PolicyInvalid when only other objects do.
func (oc *ObjectCheck) AcceptedCondition(ref ObjectRef, generation int64) metav1.Condition {
	c := metav1.Condition{Type: v1alpha1.ConditionAccepted, ObservedGeneration: generation}
	switch own := oc.ProblemsFor(ref); {
	case len(oc.Problems) == 0:
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, v1alpha1.ReasonAccepted, "the pool's policy is valid and in force"
	case len(own) > 0:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, v1alpha1.ReasonInvalid, own.Error()
	default:
		c.Status, c.Reason = metav1.ConditionFalse, v1alpha1.ReasonPolicyInvalid
		c.Message = fmt.Sprintf("other policy objects of this pool are invalid (%d problems, first: %s); the last valid policy stays in force",
			len(oc.Problems), oc.Problems[0].Message)
	}
	const maxMessage = 32 * 1024 // metav1.Condition.Message is bounded
	if len(c.Message) > maxMessage {
		c.Message = c.Message[:maxMessage-3] + "..."
	}
	return c
}

// SetAccepted writes the Accepted condition of ref into conds (a status's
// condition list), keeping LastTransitionTime when the status is unchanged.
func (oc *ObjectCheck) SetAccepted(conds *[]metav1.Condition, ref ObjectRef, generation int64) {
	apimeta.SetStatusCondition(conds, oc.AcceptedCondition(ref, generation))
}

// classKey identifies a class within the pool.
type classKey struct{ model, name string }

// FromObjects converts one pool's objects (the caller selects them by
// poolRef) to the policy model, without validating the rules: CheckObjects
// does both. Objects carry no order, so classes are ordered by class name
// within each profile and model profiles by model name; a profile without
// families and without defaultPolicyClass therefore defaults to its
// alphabetically first class. It returns the problems of combining the
// objects (two PolicyProfiles, objects of different pools, an unparsable
// decimal string), each with the object it concerns.
func FromObjects(profiles []v1alpha1.PolicyProfile, classes []v1alpha1.PolicyClass) (*Config, Problems) {
	cfg, ps, _ := fromObjects(profiles, classes)
	return cfg, ps
}

func fromObjects(profiles []v1alpha1.PolicyProfile, classes []v1alpha1.PolicyClass) (*Config, Problems, []ObjectRef) {
	var ps Problems
	var refs []ObjectRef // refs[i] is the object of ps[i]
	problem := func(ref ObjectRef, p Problem) {
		ps = append(ps, p)
		refs = append(refs, ref)
	}

	// All objects must name one pool.
	poolOf := func(r v1alpha1.PoolReference) string {
		g := r.Group
		if g == "" {
			g = v1alpha1.DefaultPoolGroup
		}
		return g + "/" + r.Name
	}
	pool := ""
	checkPool := func(ref ObjectRef, r v1alpha1.PoolReference) {
		switch p := poolOf(r); {
		case pool == "":
			pool = p
		case p != pool:
			problem(ref, Problem{Rule: RuleObject, Message: fmt.Sprintf("%s %q: poolRef names pool %s, but other objects of this policy name %s", ref.Kind, ref.Name, p, pool)})
		}
	}

	profiles = slices.Clone(profiles)
	slices.SortFunc(profiles, func(a, b v1alpha1.PolicyProfile) int { return cmp.Compare(a.Name, b.Name) })
	cfg := &Config{}
	models := map[string]*Profile{}
	var modelOrder []string
	profileFor := func(model string) *Profile {
		if model == "" {
			return &cfg.Root
		}
		if p, ok := models[model]; ok {
			return p
		}
		p := &Profile{}
		models[model] = p
		modelOrder = append(modelOrder, model)
		return p
	}
	for i := range profiles {
		pp := &profiles[i]
		ref := ObjectRef{KindPolicyProfile, pp.Name}
		checkPool(ref, pp.Spec.PoolRef)
		if i > 0 {
			problem(ref, Problem{Rule: RuleObject, Message: fmt.Sprintf("PolicyProfile %q: the pool already has PolicyProfile %q; a pool has at most one, so this one is ignored until it is deleted", pp.Name, profiles[0].Name)})
			continue
		}
		setProfile(&cfg.Root, pp.Spec.DefaultPolicyFamily, pp.Spec.UncachedISLBuckets, pp.Spec.DefaultPolicyClass)
		for _, m := range pp.Spec.Models {
			setProfile(profileFor(m.Model), m.DefaultPolicyFamily, m.UncachedISLBuckets, m.DefaultPolicyClass)
		}
		setTenants(cfg, &pp.Spec)
	}

	classes = slices.Clone(classes)
	slices.SortFunc(classes, func(a, b v1alpha1.PolicyClass) int {
		return cmp.Or(cmp.Compare(a.Spec.Model, b.Spec.Model), cmp.Compare(a.EffectiveClassName(), b.EffectiveClassName()), cmp.Compare(a.Name, b.Name))
	})
	for i := range classes {
		pc := &classes[i]
		ref := ObjectRef{KindPolicyClass, pc.Name}
		checkPool(ref, pc.Spec.PoolRef)
		c, err := classFromSpec(pc.EffectiveClassName(), &pc.Spec)
		if err != nil {
			problem(ref, Problem{Model: pc.Spec.Model, Class: c.Name, Rule: RuleObject, Message: fmt.Sprintf("PolicyClass %q: %v", pc.Name, err)})
		}
		p := profileFor(pc.Spec.Model)
		p.Classes = append(p.Classes, c)
	}
	slices.Sort(modelOrder)
	for _, m := range modelOrder {
		cfg.Models = append(cfg.Models, ModelProfile{Model: m, Profile: *models[m]})
	}
	return cfg, ps, refs
}

func setProfile(p *Profile, family string, buckets []v1alpha1.CacheBucket, class string) {
	p.DefaultFamily, p.DefaultClass = family, class
	for _, b := range buckets {
		p.Buckets = append(p.Buckets, Bucket{Name: b.Name, MinTokens: b.MinTokens})
	}
}

// setTenants copies a PolicyProfile's tenant rules into cfg.
func setTenants(cfg *Config, s *v1alpha1.PolicyProfileSpec) {
	if id := s.Identity; id != nil {
		cfg.Identity = &Identity{Header: id.Header, Anonymous: id.Anonymous}
		if m := id.Metadata; m != nil {
			cfg.Identity.MetadataNamespace, cfg.Identity.MetadataPath = m.Namespace, slices.Clone(m.Path)
		}
	}
	for i := range s.Tenants {
		b := &s.Tenants[i]
		cfg.Tenants = append(cfg.Tenants, TenantBinding{
			Name:   b.Name,
			Match:  TenantMatch{Exact: slices.Clone(b.Match.Exact), Prefix: slices.Clone(b.Match.Prefix)},
			Rights: rightsFromSpec(&b.TenantRights),
		})
	}
	if g := s.DefaultTenant; g != nil {
		r := rightsFromSpec(g)
		cfg.DefaultTenant = &r
	}
}

func rightsFromSpec(g *v1alpha1.TenantRights) Rights {
	return Rights{
		Allowed:               slices.Clone(g.Allowed),
		DefaultFamily:         g.DefaultFamily,
		Weight:                clonePtr(g.Weight),
		MaxPriority:           clonePtr(g.MaxPriority),
		MaxStrictPriority:     clonePtr(g.MaxStrictPriority),
		RequestQueueLimit:     clonePtr(g.RequestQueueLimit),
		RawISLTokenQueueLimit: clonePtr(g.RawISLTokenQueueLimit),
	}
}

func rightsToSpec(b *Rights) v1alpha1.TenantRights {
	return v1alpha1.TenantRights{
		Allowed:               slices.Clone(b.Allowed),
		DefaultFamily:         b.DefaultFamily,
		Weight:                clonePtr(b.Weight),
		MaxPriority:           clonePtr(b.MaxPriority),
		MaxStrictPriority:     clonePtr(b.MaxStrictPriority),
		RequestQueueLimit:     clonePtr(b.RequestQueueLimit),
		RawISLTokenQueueLimit: clonePtr(b.RawISLTokenQueueLimit),
	}
}

// tenantsToSpec writes cfg's tenant rules into a PolicyProfile spec.
func tenantsToSpec(cfg *Config, s *v1alpha1.PolicyProfileSpec) {
	if id := cfg.Identity; id != nil {
		s.Identity = &v1alpha1.Identity{Header: id.Header, Anonymous: id.Anonymous}
		if id.MetadataNamespace != "" || len(id.MetadataPath) > 0 {
			s.Identity.Metadata = &v1alpha1.IdentityMetadata{Namespace: id.MetadataNamespace, Path: slices.Clone(id.MetadataPath)}
		}
	}
	for i := range cfg.Tenants {
		b := &cfg.Tenants[i]
		s.Tenants = append(s.Tenants, v1alpha1.TenantBinding{
			Name:         b.Name,
			Match:        v1alpha1.TenantMatch{Exact: slices.Clone(b.Match.Exact), Prefix: slices.Clone(b.Match.Prefix)},
			TenantRights: rightsToSpec(&b.Rights),
		})
	}
	if r := cfg.DefaultTenant; r != nil {
		g := rightsToSpec(r)
		s.DefaultTenant = &g
	}
}

// hasTenantRules reports whether cfg says anything about tenants.
func (c *Config) hasTenantRules() bool {
	return c.Identity != nil || len(c.Tenants) > 0 || c.DefaultTenant != nil
}

// parseDecimal reads a decimal-string field (admission already checked its
// syntax; this catches objects written before, or overflow).
func parseDecimal(field string, s *string) (*float64, error) {
	if s == nil {
		return nil, nil
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(*s), 64)
	if err != nil {
		return nil, fmt.Errorf("%s %q is not a decimal number: %w", field, *s, err)
	}
	return &v, nil
}

func classFromSpec(name string, s *v1alpha1.PolicyClassSpec) (Class, error) {
	c := Class{
		Name:                            name,
		Family:                          s.PolicyFamily,
		Bucket:                          s.CacheBucket,
		QueuePolicy:                     string(s.QueuePolicy),
		Quantum:                         s.Quantum,
		RequestQueueLimitPerWorker:      clonePtr(s.RequestQueueLimitPerWorker),
		RawISLTokenQueueLimitPerWorker:  clonePtr(s.RawISLTokenQueueLimitPerWorker),
		CachedTokenQueueLimitPerWorker:  clonePtr(s.CachedTokenQueueLimitPerWorker),
		TenantFairness:                  s.TenantFairness,
		MaxTenants:                      clonePtr(s.MaxTenants),
		DisaggregateAboveUncachedTokens: clonePtr(s.DisaggregateAboveUncachedTokens),
	}
	if c.QueuePolicy == "" {
		c.QueuePolicy = DefaultQueuePolicy
	}
	if s.MaxQueueWait != nil {
		c.MaxQueueWait = s.MaxQueueWait.Duration
	}
	if t := s.PrefillBusyThreshold; t != nil {
		if t.Type == intstr.Int {
			c.PrefillBusyThreshold = ptr(int64(t.IntVal))
		} else {
			c.BusyMode = t.StrVal // Validate names a word it does not know
		}
	}
	var err1, err2 error
	c.PrefillBusyThresholdFrac, err1 = parseDecimal("prefillBusyThresholdFrac", s.PrefillBusyThresholdFrac)
	c.BusyWorkerRatio, err2 = parseDecimal("busyWorkerRatio", s.BusyWorkerRatio)
	if err1 != nil {
		return c, err1
	}
	return c, err2
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// CheckObjects converts one pool's objects to the policy model and validates
// it with the same rules and messages as the YAML loader, attributing each
// problem to the objects involved: a class problem to the PolicyClass
// objects of that class, a family problem to the family's classes, a
// profile-level or tenant-rule problem (identity, bindings, default
// binding) to the PolicyProfile (or, without one, to the profile's
// classes).
func CheckObjects(profiles []v1alpha1.PolicyProfile, classes []v1alpha1.PolicyClass) *ObjectCheck {
	cfg, ps, refs := fromObjects(profiles, classes)
	oc := &ObjectCheck{byObject: map[ObjectRef][]int{}}
	for i := range ps {
		oc.byObject[refs[i]] = append(oc.byObject[refs[i]], i)
	}
	if err := cfg.Validate(); err != nil {
		vps, _ := err.(Problems)
		profileName := ""
		if len(profiles) > 0 {
			profileName = slices.MinFunc(profiles, func(a, b v1alpha1.PolicyProfile) int { return cmp.Compare(a.Name, b.Name) }).Name
		}
		byClass := map[classKey][]string{}
		byFamily := map[classKey][]string{}
		byModel := map[string][]string{}
		for i := range classes {
			pc := &classes[i]
			m := pc.Spec.Model
			byClass[classKey{m, pc.EffectiveClassName()}] = append(byClass[classKey{m, pc.EffectiveClassName()}], pc.Name)
			if pc.Spec.PolicyFamily != "" {
				byFamily[classKey{m, pc.Spec.PolicyFamily}] = append(byFamily[classKey{m, pc.Spec.PolicyFamily}], pc.Name)
			}
			byModel[m] = append(byModel[m], pc.Name)
		}
		for _, p := range vps {
			idx := len(oc.Problems) + len(ps)
			var targets []ObjectRef
			addClasses := func(names []string) {
				for _, n := range names {
					targets = append(targets, ObjectRef{KindPolicyClass, n})
				}
			}
			switch {
			case p.Class != "":
				addClasses(byClass[classKey{p.Model, p.Class}])
			case p.Family != "":
				addClasses(byFamily[classKey{p.Model, p.Family}])
			}
			if len(targets) == 0 {
				if profileName != "" {
					targets = append(targets, ObjectRef{KindPolicyProfile, profileName})
				} else {
					addClasses(byModel[p.Model])
				}
			}
			for _, t := range targets {
				oc.byObject[t] = append(oc.byObject[t], idx)
			}
			oc.Problems = append(oc.Problems, p)
		}
	}
	// Conversion problems first, then the rules, as indexes above assume.
	oc.Problems = append(ps, oc.Problems...)
	if len(oc.Problems) == 0 {
		oc.Config = cfg
	}
	return oc
}

// ToObjects converts a Config to the objects of one pool in namespace ns:
// one PolicyProfile named after the pool, carrying the pool-level settings
// and the tenant rules (nil for the empty Config, whose synthetic class
// needs no objects), and one PolicyClass per class. Applied, they resolve
// requests exactly like the Config: an implicit default class (the first
// listed one) is made explicit, since objects have no order; tenant
// bindings keep their order, which decides the first match.
func ToObjects(cfg *Config, pool, ns string) (*v1alpha1.PolicyProfile, []v1alpha1.PolicyClass) {
	if len(cfg.Root.Classes) == 0 && len(cfg.Models) == 0 && cfg.Root.DefaultFamily == "" && len(cfg.Root.Buckets) == 0 && !cfg.hasTenantRules() {
		return nil, nil
	}
	canon := cfg.Canonical()
	labels := func() map[string]string { return map[string]string{PoolLabel: pool} }
	ref := v1alpha1.PoolReference{Group: v1alpha1.DefaultPoolGroup, Name: pool}
	prof := &v1alpha1.PolicyProfile{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: KindPolicyProfile},
		ObjectMeta: metav1.ObjectMeta{Name: pool, Namespace: ns, Labels: labels()},
		Spec: v1alpha1.PolicyProfileSpec{
			PoolRef:             ref,
			DefaultPolicyFamily: canon.Root.DefaultFamily,
			UncachedISLBuckets:  toBuckets(canon.Root.Buckets),
			DefaultPolicyClass:  canon.Root.DefaultClass,
		},
	}
	tenantsToSpec(canon, &prof.Spec)
	var classes []v1alpha1.PolicyClass
	used := map[string]bool{}
	add := func(model string, c *Class) {
		pc := v1alpha1.PolicyClass{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: KindPolicyClass},
			ObjectMeta: metav1.ObjectMeta{Name: objectName(pool, model, c.Name, used), Namespace: ns, Labels: labels()},
			Spec:       specFromClass(model, c),
		}
		pc.Spec.PoolRef = ref
		classes = append(classes, pc)
	}
	for i := range canon.Root.Classes {
		add("", &canon.Root.Classes[i])
	}
	for _, m := range canon.Models {
		prof.Spec.Models = append(prof.Spec.Models, v1alpha1.ModelProfile{
			Model:               m.Model,
			DefaultPolicyFamily: m.Profile.DefaultFamily,
			UncachedISLBuckets:  toBuckets(m.Profile.Buckets),
			DefaultPolicyClass:  m.Profile.DefaultClass,
		})
		for i := range m.Profile.Classes {
			add(m.Model, &m.Profile.Classes[i])
		}
	}
	return prof, classes
}

func toBuckets(bs []Bucket) []v1alpha1.CacheBucket {
	var out []v1alpha1.CacheBucket
	for _, b := range bs {
		out = append(out, v1alpha1.CacheBucket{Name: b.Name, MinTokens: b.MinTokens})
	}
	return out
}

func specFromClass(model string, c *Class) v1alpha1.PolicyClassSpec {
	s := v1alpha1.PolicyClassSpec{
		Model:                           model,
		ClassName:                       c.Name,
		PolicyFamily:                    c.Family,
		CacheBucket:                     c.Bucket,
		QueuePolicy:                     v1alpha1.QueuePolicy(c.QueuePolicy),
		Quantum:                         c.Quantum,
		RequestQueueLimitPerWorker:      clonePtr(c.RequestQueueLimitPerWorker),
		RawISLTokenQueueLimitPerWorker:  clonePtr(c.RawISLTokenQueueLimitPerWorker),
		CachedTokenQueueLimitPerWorker:  clonePtr(c.CachedTokenQueueLimitPerWorker),
		TenantFairness:                  c.TenantFairness,
		MaxTenants:                      clonePtr(c.MaxTenants),
		DisaggregateAboveUncachedTokens: clonePtr(c.DisaggregateAboveUncachedTokens),
	}
	switch {
	case c.PrefillBusyThreshold != nil:
		// The CRD's integer form is 32 bits; no engine keeps 2^31 tokens
		// in prefill, so a larger threshold is as good as that one.
		s.PrefillBusyThreshold = ptr(intstr.FromInt32(int32(min(*c.PrefillBusyThreshold, math.MaxInt32))))
	case c.BusyMode != "":
		s.PrefillBusyThreshold = ptr(intstr.FromString(c.BusyMode))
	}
	if c.PrefillBusyThresholdFrac != nil {
		s.PrefillBusyThresholdFrac = ptr(formatFloat(*c.PrefillBusyThresholdFrac))
	}
	if c.BusyWorkerRatio != nil {
		s.BusyWorkerRatio = ptr(formatFloat(*c.BusyWorkerRatio))
	}
	if c.MaxQueueWait != 0 {
		s.MaxQueueWait = &metav1.Duration{Duration: c.MaxQueueWait}
	}
	return s
}

// maxObjectName keeps generated names well inside the 253-byte limit of a
// DNS subdomain.
const maxObjectName = 200

// objectName derives a DNS-subdomain object name for a class: the pool,
// the model and the class, lowercased, with other characters as '-'. When
// that loses information (case, '_', '/', length) or collides, a hash of
// the exact names keeps it unique.
func objectName(pool, model, class string, used map[string]bool) string {
	parts := []string{pool}
	if model != "" {
		parts = append(parts, model)
	}
	parts = append(parts, class)
	raw := strings.Join(parts, "-")
	var b strings.Builder
	lossy := false
	for _, r := range raw {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '.':
			b.WriteRune(r)
		case r >= 'A' && r <= 'Z':
			b.WriteRune(r - 'A' + 'a')
			lossy = true
		default:
			b.WriteByte('-')
			lossy = true
		}
	}
	name := strings.Trim(b.String(), "-.")
	if len(name) > maxObjectName {
		name, lossy = strings.Trim(name[:maxObjectName], "-."), true
	}
	if name == "" {
		name, lossy = "class", true
	}
	if lossy || used[name] {
		h := fnv.New32a()
		h.Write([]byte(model + "\x00" + class))
		name = fmt.Sprintf("%s-%08x", name, h.Sum32())
	}
	base := name
	for i := 2; used[name]; i++ {
		name = fmt.Sprintf("%s-%d", base, i)
	}
	used[name] = true
	return name
}
