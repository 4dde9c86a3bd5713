package policy

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Rule identifies which rule a Problem breaks, for code that reacts to a
// kind of problem (tests, the controller's condition reasons). People read
// Problem.Message.
type Rule string

// The rules of SPEC §2, plus the loaders' own.
const (
	RuleFamilyMissingBucket    Rule = "FamilyMissingBucket"
	RuleDuplicateFamilyBucket  Rule = "DuplicateFamilyBucket"
	RuleNameMalformed          Rule = "NameMalformed"
	RuleNameDuplicate          Rule = "NameDuplicate"
	RuleUnknownBucket          Rule = "UnknownBucket"
	RuleFamilyBucketTogether   Rule = "FamilyBucketTogether"
	RuleExplicitNameIsFamily   Rule = "ExplicitNameIsFamily"
	RuleFirstBucketNotZero     Rule = "FirstBucketNotZero"
	RuleBucketNameRepeats      Rule = "BucketNameRepeats"
	RuleBucketsNotIncreasing   Rule = "BucketsNotIncreasing"
	RuleBucketNameEmpty        Rule = "BucketNameEmpty"
	RuleQuantum                Rule = "Quantum"
	RuleQueuePolicy            Rule = "QueuePolicy"
	RuleDefaultFamilyUnknown   Rule = "DefaultFamilyUnknown"
	RuleFamilySettingsTogether Rule = "FamilySettingsTogether"
	RuleFamilySettingsRequired Rule = "FamilySettingsRequired"
	RuleDefaultClassUnknown    Rule = "DefaultClassUnknown"
	RuleBusyWorkerRatio        Rule = "BusyWorkerRatio"
	RuleRatioWithoutThreshold  Rule = "RatioWithoutThreshold"
	RuleThresholdFrac          Rule = "ThresholdFrac"
	RuleNegative               Rule = "Negative"
	RuleModelName              Rule = "ModelName"
	RuleTooLarge               Rule = "TooLarge"
	RuleIdentity               Rule = "Identity"
	RuleEmptyClasses           Rule = "EmptyClasses"
	RuleTenant                 Rule = "Tenant"
	// RuleSyntax: the YAML could not be read (syntax, unknown key, type).
	RuleSyntax Rule = "Syntax"
	// RuleObject: the objects of a pool could not be combined (two
	// PolicyProfiles, mixed pools, an unparsable decimal string).
	RuleObject Rule = "Object"
)

// Problem is one reason a policy is invalid.
type Problem struct {
	// Model is the model profile the problem is in; "" for the root one.
	Model string
	// Class is the class the problem concerns, if it concerns one.
	Class string
	// Family is the policy family the problem concerns, if it concerns one
	// and no single class.
	Family string
	// Rule is the rule broken.
	Rule Rule
	// Message is the full text: where, which rule, and the values involved.
	Message string
}

// Error returns the message.
func (p Problem) Error() string { return p.Message }

// Problems is every problem found in one policy. As an error, it prints one
// problem per line.
type Problems []Problem

// Error joins the messages, one per line.
func (ps Problems) Error() string {
	var b strings.Builder
	for i, p := range ps {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(p.Message)
	}
	return b.String()
}

// Has reports whether some problem breaks rule r.
func (ps Problems) Has(r Rule) bool {
	for _, p := range ps {
		if p.Rule == r {
			return true
		}
	}
	return false
}

// Size bounds: a policy is configuration written by people, and the bounds
// keep a hostile or broken file from costing unbounded memory at compile.
const (
	MaxClassesPerProfile = 1024
	MaxBucketsPerProfile = 64
	MaxModels            = 1024
)

// validClassName reports whether s matches [A-Za-z0-9_.-]+.
func validClassName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '.', c == '-':
		default:
			return false
		}
	}
	return true
}

// Validate checks every rule of SPEC §2 on every profile and returns nil or
// a Problems listing all violations, in file order, each naming the model
// profile (if not the root), the class or family, and the rule.
func (c *Config) Validate() error {
	var ps Problems
	validateProfile(&ps, "", &c.Root)
	if len(c.Models) > MaxModels {
		ps = append(ps, Problem{Rule: RuleTooLarge, Message: fmt.Sprintf("models: %d model profiles, at most %d allowed", len(c.Models), MaxModels)})
	}
	seen := make(map[string]bool, len(c.Models))
	for i := range c.Models {
		m := &c.Models[i]
		switch {
		case m.Model == "":
			ps = append(ps, Problem{Rule: RuleModelName, Message: fmt.Sprintf("models[%d]: model name is empty", i)})
			continue
		case seen[m.Model]:
			ps = append(ps, Problem{Model: m.Model, Rule: RuleModelName, Message: fmt.Sprintf("model %q: more than one profile for this model", m.Model)})
			continue
		}
		seen[m.Model] = true
		validateProfile(&ps, m.Model, &m.Profile)
	}
	validateTenants(&ps, c)
	if len(ps) == 0 {
		return nil
	}
	return ps
}

// validateProfile appends the problems of one profile. model is "" for the
// root profile; every message starts with the location.
func validateProfile(ps *Problems, model string, p *Profile) {
	v := &profileCheck{ps: ps, model: model, p: p}
	if model != "" {
		v.where = fmt.Sprintf("model %q: ", model)
	}
	if !v.checkSize() {
		return
	}
	v.checkBuckets()
	v.checkFamilySettings()
	v.names = make(map[string]int, len(p.Classes))
	v.families = make(map[string][]int)
	v.pair = make(map[[2]string]int)
	for i := range p.Classes {
		cl := &p.Classes[i]
		name := v.checkClassName(i, cl)
		v.checkClassFamily(i, cl, name)
		v.checkClassSettings(cl, name)
	}
	v.checkExplicitNames()
	v.checkFamiliesComplete()
	v.checkDefaults()
}

// profileCheck is the state of validating one profile: where the
// problems go, and what the checks of each class collect for the checks
// across classes.
type profileCheck struct {
	ps    *Problems
	model string
	where string // "" or `model "m": `, the start of every message
	p     *Profile

	bucketIdx   map[string]int    // bucket name -> its index
	names       map[string]int    // class name -> its first index
	families    map[string][]int  // family -> class indexes, in order
	familyOrder []string          // families, first seen first
	pair        map[[2]string]int // (family, bucket) -> its first class
}

// add appends a problem about class (or family, or neither).
func (v *profileCheck) add(class, family string, r Rule, format string, args ...any) {
	msg := v.where
	if class != "" {
		msg += fmt.Sprintf("class %q: ", class)
	}
	*v.ps = append(*v.ps, Problem{Model: v.model, Class: class, Family: family, Rule: r, Message: msg + fmt.Sprintf(format, args...)})
}

// checkSize reports an empty class list and the size bounds; false means
// the profile is too large to check further.
func (v *profileCheck) checkSize() bool {
	p := v.p
	if p.EmptyClasses && len(p.Classes) == 0 {
		v.add("", "", RuleEmptyClasses, "policy_classes is an empty list: list at least one class, or leave the key out for the synthetic default class")
	}
	if len(p.Classes) > MaxClassesPerProfile {
		v.add("", "", RuleTooLarge, "policy_classes: %d classes, at most %d allowed", len(p.Classes), MaxClassesPerProfile)
		return false
	}
	if len(p.Buckets) > MaxBucketsPerProfile {
		v.add("", "", RuleTooLarge, "uncached_isl_buckets: %d buckets, at most %d allowed", len(p.Buckets), MaxBucketsPerProfile)
		return false
	}
	return true
}

// checkBuckets checks the bucket list: names present and unique, the
// first at 0, min_tokens strictly increasing.
func (v *profileCheck) checkBuckets() {
	p := v.p
	v.bucketIdx = make(map[string]int, len(p.Buckets))
	for i, b := range p.Buckets {
		label := fmt.Sprintf("uncached_isl_buckets[%d]", i)
		if b.Name != "" {
			label += fmt.Sprintf(" (%q)", b.Name)
		}
		switch j, dup := v.bucketIdx[b.Name]; {
		case b.Name == "":
			v.add("", "", RuleBucketNameEmpty, "%s: bucket name is empty", label)
		case dup:
			v.add("", "", RuleBucketNameRepeats, "%s: bucket name %q repeats (also uncached_isl_buckets[%d])", label, b.Name, j)
		default:
			v.bucketIdx[b.Name] = i
		}
		if i == 0 && b.MinTokens != 0 {
			v.add("", "", RuleFirstBucketNotZero, "%s: the first bucket's min_tokens must be 0 (got %d)", label, b.MinTokens)
		}
		if i > 0 && b.MinTokens <= p.Buckets[i-1].MinTokens {
			v.add("", "", RuleBucketsNotIncreasing, "%s: min_tokens must be strictly increasing (got %d after %d)", label, b.MinTokens, p.Buckets[i-1].MinTokens)
		}
	}
}

// checkFamilySettings checks the profile settings that go together:
// default_policy_family with the buckets, and both once a class names a
// family.
func (v *profileCheck) checkFamilySettings() {
	p := v.p
	switch {
	case (p.DefaultFamily == "") != (len(p.Buckets) == 0):
		v.add("", "", RuleFamilySettingsTogether,
			"default_policy_family and uncached_isl_buckets go together: set both or neither (default_policy_family %q, %d buckets)",
			p.DefaultFamily, len(p.Buckets))
	case p.HasFamilies() && p.DefaultFamily == "":
		first := ""
		for i := range p.Classes {
			if !p.Classes[i].Explicit() {
				first = p.Classes[i].Name
				break
			}
		}
		v.add(first, "", RuleFamilySettingsRequired,
			"names a policy family, so default_policy_family and uncached_isl_buckets are required")
	}
}

// checkClassName checks class i's name (present, well formed, unique) and
// returns the name its problems go under.
func (v *profileCheck) checkClassName(i int, cl *Class) string {
	name := cl.Name
	if name == "" {
		name = fmt.Sprintf("policy_classes[%d]", i)
		*v.ps = append(*v.ps, Problem{Model: v.model, Rule: RuleNameMalformed, Message: v.where + name + ": name is required"})
	} else if !validClassName(name) {
		v.add(name, "", RuleNameMalformed, "name must match [A-Za-z0-9_.-]+")
	}
	if j, dup := v.names[cl.Name]; dup && cl.Name != "" {
		v.add(name, "", RuleNameDuplicate, "name is used by more than one class (policy_classes[%d] and [%d])", j, i)
	} else if cl.Name != "" {
		v.names[cl.Name] = i
	}
	return name
}

// checkClassFamily checks class i's family and bucket (set together, a
// known bucket, one class per pair) and records its family.
func (v *profileCheck) checkClassFamily(i int, cl *Class, name string) {
	switch {
	case (cl.Family == "") != (cl.Bucket == ""):
		v.add(name, "", RuleFamilyBucketTogether,
			"policy_family and cache_bucket must be set together, or neither for an explicit class (policy_family %q, cache_bucket %q)",
			cl.Family, cl.Bucket)
	case cl.Family != "":
		if _, ok := v.bucketIdx[cl.Bucket]; !ok && len(v.p.Buckets) > 0 {
			v.add(name, "", RuleUnknownBucket, "cache_bucket %q is not a bucket of uncached_isl_buckets (%s)", cl.Bucket, bucketNames(v.p.Buckets))
		}
		key := [2]string{cl.Family, cl.Bucket}
		if j, dup := v.pair[key]; dup {
			v.add(name, "", RuleDuplicateFamilyBucket,
				"policy family %q already has a class for cache bucket %q (class %q)", cl.Family, cl.Bucket, v.p.Classes[j].Name)
		} else {
			v.pair[key] = i
		}
		if _, ok := v.families[cl.Family]; !ok {
			v.familyOrder = append(v.familyOrder, cl.Family)
		}
		v.families[cl.Family] = append(v.families[cl.Family], i)
	}
}

// checkClassSettings checks the settings of one class: queue policy,
// quantum, busy test, limits, wait budget, tenants.
func (v *profileCheck) checkClassSettings(cl *Class, name string) {
	switch cl.QueuePolicy {
	case QueuePolicyFCFS, QueuePolicyWSPT, QueuePolicyEDF:
	default:
		v.add(name, "", RuleQueuePolicy, "queue_policy %q is unknown (want fcfs, wspt or edf)", cl.QueuePolicy)
	}
	if cl.Quantum <= 0 {
		v.add(name, "", RuleQuantum, "quantum must be > 0 (got %d)", cl.Quantum)
	}
	v.checkBusyTest(cl, name)
	for _, l := range []struct {
		key string
		v   *int64
	}{
		{"request_queue_limit_per_worker", cl.RequestQueueLimitPerWorker},
		{"raw_isl_token_queue_limit_per_worker", cl.RawISLTokenQueueLimitPerWorker},
		{"cached_token_queue_limit_per_worker", cl.CachedTokenQueueLimitPerWorker},
		{"disaggregate_above_uncached_tokens", cl.DisaggregateAboveUncachedTokens},
	} {
		if l.v != nil && *l.v < 0 {
			v.add(name, "", RuleNegative, "%s must be >= 0 (got %d)", l.key, *l.v)
		}
	}
	if cl.MaxQueueWait < 0 {
		v.add(name, "", RuleNegative, "max_queue_wait must be >= 0 (got %s)", cl.MaxQueueWait)
	}
	if m := cl.MaxTenants; m != nil {
		switch {
		case !cl.TenantFairness:
			v.add(name, "", RuleTenant, "max_tenants is set without tenant_fairness")
		case *m < 1:
			v.add(name, "", RuleNegative, "max_tenants must be >= 1 (got %d)", *m)
		}
	}
}

// checkBusyTest checks a class's busy-test parameters: the thresholds and
// the busy worker ratio, which needs one of them.
func (v *profileCheck) checkBusyTest(cl *Class, name string) {
	if t := cl.PrefillBusyThreshold; t != nil && *t < 0 {
		v.add(name, "", RuleNegative, "prefill_busy_threshold must be >= 0 (got %d)", *t)
	}
	if f := cl.PrefillBusyThresholdFrac; f != nil && (math.IsNaN(*f) || math.IsInf(*f, 0) || *f < 0) {
		v.add(name, "", RuleThresholdFrac, "prefill_busy_threshold_frac must be finite and >= 0 (got %s)", formatFloat(*f))
	}
	if cl.BusyMode != "" && cl.BusyMode != BusyAuto && cl.BusyMode != BusyNone {
		v.add(name, "", RuleThresholdFrac, "prefill_busy_threshold %q: want an integer, %s or %s", cl.BusyMode, BusyAuto, BusyNone)
	}
	if cl.BusyMode != "" && (cl.PrefillBusyThreshold != nil || cl.PrefillBusyThresholdFrac != nil) {
		v.add(name, "", RuleThresholdFrac, "prefill_busy_threshold %s cannot go with a number or prefill_busy_threshold_frac", cl.BusyMode)
	}
	if r := cl.BusyWorkerRatio; r != nil {
		if math.IsNaN(*r) || !(*r > 0 && *r <= 1) {
			v.add(name, "", RuleBusyWorkerRatio, "busy_worker_ratio must be > 0 and <= 1 (got %s)", formatFloat(*r))
		}
		// The ratio tunes a threshold the class writes down (a number, a
		// fraction or auto), not the default.
		if cl.PrefillBusyThreshold == nil && cl.PrefillBusyThresholdFrac == nil && cl.BusyMode != BusyAuto {
			v.add(name, "", RuleRatioWithoutThreshold, "busy_worker_ratio is set without a threshold: set prefill_busy_threshold or prefill_busy_threshold_frac")
		}
	}
}

// checkExplicitNames reports explicit classes named like a family, which
// a class header could not tell apart.
func (v *profileCheck) checkExplicitNames() {
	for i := range v.p.Classes {
		cl := &v.p.Classes[i]
		if cl.Explicit() && cl.Name != "" {
			if _, ok := v.families[cl.Name]; ok {
				v.add(cl.Name, "", RuleExplicitNameIsFamily,
					"explicit class name equals policy family %q; a class header naming it would be ambiguous", cl.Name)
			}
		}
	}
}

// checkFamiliesComplete reports each family without a class for some
// bucket.
func (v *profileCheck) checkFamiliesComplete() {
	if len(v.p.Buckets) == 0 {
		return
	}
	for _, f := range v.familyOrder {
		for _, b := range v.p.Buckets {
			if b.Name == "" {
				continue
			}
			if _, ok := v.pair[[2]string{f, b.Name}]; !ok {
				v.add("", f, RuleFamilyMissingBucket, "policy family %q has no class for cache bucket %q", f, b.Name)
			}
		}
	}
}

// checkDefaults reports a default family or default class that names
// nothing in the profile.
func (v *profileCheck) checkDefaults() {
	p := v.p
	if p.DefaultFamily != "" {
		if _, ok := v.families[p.DefaultFamily]; !ok {
			v.add("", "", RuleDefaultFamilyUnknown, "default_policy_family %q names no policy family (families: %s)",
				p.DefaultFamily, listOrNone(v.familyOrder))
		}
	}
	if p.DefaultClass != "" {
		if _, ok := v.names[p.DefaultClass]; !ok {
			v.add("", "", RuleDefaultClassUnknown, "default_policy_class %q names no class of policy_classes", p.DefaultClass)
		}
	}
}

func bucketNames(bs []Bucket) string {
	names := make([]string, 0, len(bs))
	for _, b := range bs {
		names = append(names, b.Name)
	}
	return listOrNone(names)
}

func listOrNone(xs []string) string {
	if len(xs) == 0 {
		return "none"
	}
	return strings.Join(xs, ", ")
}

// formatFloat prints f the shortest way that reads back as f: the form the
// decimal-string fields of the CRDs use.
// Negative zero prints as "0": it is the same threshold, and "-0" would not
// pass the CRD's decimal pattern.
func formatFloat(f float64) string {
	if f == 0 {
		f = 0
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}
