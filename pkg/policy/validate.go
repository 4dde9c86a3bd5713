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
	where := ""
	if model != "" {
		where = fmt.Sprintf("model %q: ", model)
	}
	add := func(class, family string, r Rule, format string, args ...any) {
		msg := where
		if class != "" {
			msg += fmt.Sprintf("class %q: ", class)
		}
		*ps = append(*ps, Problem{Model: model, Class: class, Family: family, Rule: r, Message: msg + fmt.Sprintf(format, args...)})
	}

	if p.EmptyClasses && len(p.Classes) == 0 {
		add("", "", RuleEmptyClasses, "policy_classes is an empty list: list at least one class, or leave the key out for the synthetic default class")
	}
	if len(p.Classes) > MaxClassesPerProfile {
		add("", "", RuleTooLarge, "policy_classes: %d classes, at most %d allowed", len(p.Classes), MaxClassesPerProfile)
		return
	}
	if len(p.Buckets) > MaxBucketsPerProfile {
		add("", "", RuleTooLarge, "uncached_isl_buckets: %d buckets, at most %d allowed", len(p.Buckets), MaxBucketsPerProfile)
		return
	}

	// Buckets.
	bucketIdx := make(map[string]int, len(p.Buckets))
	for i, b := range p.Buckets {
		label := fmt.Sprintf("uncached_isl_buckets[%d]", i)
		if b.Name != "" {
			label += fmt.Sprintf(" (%q)", b.Name)
		}
		switch j, dup := bucketIdx[b.Name]; {
		case b.Name == "":
			add("", "", RuleBucketNameEmpty, "%s: bucket name is empty", label)
		case dup:
			add("", "", RuleBucketNameRepeats, "%s: bucket name %q repeats (also uncached_isl_buckets[%d])", label, b.Name, j)
		default:
			bucketIdx[b.Name] = i
		}
		if i == 0 && b.MinTokens != 0 {
			add("", "", RuleFirstBucketNotZero, "%s: the first bucket's min_tokens must be 0 (got %d)", label, b.MinTokens)
		}
		if i > 0 && b.MinTokens <= p.Buckets[i-1].MinTokens {
			add("", "", RuleBucketsNotIncreasing, "%s: min_tokens must be strictly increasing (got %d after %d)", label, b.MinTokens, p.Buckets[i-1].MinTokens)
		}
	}
	bucketList := bucketNames(p.Buckets)

	// Pool-level settings that go together.
	hasFamilies := p.HasFamilies()
	switch {
	case (p.DefaultFamily == "") != (len(p.Buckets) == 0):
		add("", "", RuleFamilySettingsTogether,
			"default_policy_family and uncached_isl_buckets go together: set both or neither (default_policy_family %q, %d buckets)",
			p.DefaultFamily, len(p.Buckets))
	case hasFamilies && p.DefaultFamily == "":
		first := ""
		for i := range p.Classes {
			if !p.Classes[i].Explicit() {
				first = p.Classes[i].Name
				break
			}
		}
		add(first, "", RuleFamilySettingsRequired,
			"names a policy family, so default_policy_family and uncached_isl_buckets are required")
	}

	// Per class.
	names := make(map[string]int, len(p.Classes))
	families := make(map[string][]int) // family -> class indexes, in order
	var familyOrder []string
	pair := make(map[[2]string]int)
	for i := range p.Classes {
		cl := &p.Classes[i]
		name := cl.Name
		if name == "" {
			name = fmt.Sprintf("policy_classes[%d]", i)
			*ps = append(*ps, Problem{Model: model, Rule: RuleNameMalformed, Message: where + name + ": name is required"})
		} else if !validClassName(name) {
			add(name, "", RuleNameMalformed, "name must match [A-Za-z0-9_.-]+")
		}
		if j, dup := names[cl.Name]; dup && cl.Name != "" {
			add(name, "", RuleNameDuplicate, "name is used by more than one class (policy_classes[%d] and [%d])", j, i)
		} else if cl.Name != "" {
			names[cl.Name] = i
		}

		switch {
		case (cl.Family == "") != (cl.Bucket == ""):
			add(name, "", RuleFamilyBucketTogether,
				"policy_family and cache_bucket must be set together, or neither for an explicit class (policy_family %q, cache_bucket %q)",
				cl.Family, cl.Bucket)
		case cl.Family != "":
			if _, ok := bucketIdx[cl.Bucket]; !ok && len(p.Buckets) > 0 {
				add(name, "", RuleUnknownBucket, "cache_bucket %q is not a bucket of uncached_isl_buckets (%s)", cl.Bucket, bucketList)
			}
			key := [2]string{cl.Family, cl.Bucket}
			if j, dup := pair[key]; dup {
				add(name, "", RuleDuplicateFamilyBucket,
					"policy family %q already has a class for cache bucket %q (class %q)", cl.Family, cl.Bucket, p.Classes[j].Name)
			} else {
				pair[key] = i
			}
			if _, ok := families[cl.Family]; !ok {
				familyOrder = append(familyOrder, cl.Family)
			}
			families[cl.Family] = append(families[cl.Family], i)
		}

		switch cl.QueuePolicy {
		case QueuePolicyFCFS, QueuePolicyWSPT, QueuePolicyEDF:
		default:
			add(name, "", RuleQueuePolicy, "queue_policy %q is unknown (want fcfs, wspt or edf)", cl.QueuePolicy)
		}
		if cl.Quantum <= 0 {
			add(name, "", RuleQuantum, "quantum must be > 0 (got %d)", cl.Quantum)
		}
		if v := cl.PrefillBusyThreshold; v != nil && *v < 0 {
			add(name, "", RuleNegative, "prefill_busy_threshold must be >= 0 (got %d)", *v)
		}
		if v := cl.PrefillBusyThresholdFrac; v != nil && (math.IsNaN(*v) || math.IsInf(*v, 0) || *v < 0) {
			add(name, "", RuleThresholdFrac, "prefill_busy_threshold_frac must be finite and >= 0 (got %s)", formatFloat(*v))
		}
		if v := cl.BusyWorkerRatio; v != nil {
			if math.IsNaN(*v) || !(*v > 0 && *v <= 1) {
				add(name, "", RuleBusyWorkerRatio, "busy_worker_ratio must be > 0 and <= 1 (got %s)", formatFloat(*v))
			}
			if !cl.Queueing() {
				add(name, "", RuleRatioWithoutThreshold, "busy_worker_ratio is set without a threshold: set prefill_busy_threshold or prefill_busy_threshold_frac")
			}
		}
		for _, l := range []struct {
			key string
			v   *int64
		}{
			{"request_queue_limit_per_worker", cl.RequestQueueLimitPerWorker},
			{"raw_isl_token_queue_limit_per_worker", cl.RawISLTokenQueueLimitPerWorker},
			{"cached_token_queue_limit_per_worker", cl.CachedTokenQueueLimitPerWorker},
		} {
			if l.v != nil && *l.v < 0 {
				add(name, "", RuleNegative, "%s must be >= 0 (got %d)", l.key, *l.v)
			}
		}
		if cl.MaxQueueWait < 0 {
			add(name, "", RuleNegative, "max_queue_wait must be >= 0 (got %s)", cl.MaxQueueWait)
		}
		if v := cl.MaxTenants; v != nil {
			switch {
			case !cl.TenantFairness:
				add(name, "", RuleTenant, "max_tenants is set without tenant_fairness")
			case *v < 1:
				add(name, "", RuleNegative, "max_tenants must be >= 1 (got %d)", *v)
			}
		}
	}

	// Rules across classes.
	for i := range p.Classes {
		cl := &p.Classes[i]
		if cl.Explicit() && cl.Name != "" {
			if _, ok := families[cl.Name]; ok {
				add(cl.Name, "", RuleExplicitNameIsFamily,
					"explicit class name equals policy family %q; a class header naming it would be ambiguous", cl.Name)
			}
		}
	}
	if len(p.Buckets) > 0 {
		for _, f := range familyOrder {
			for _, b := range p.Buckets {
				if b.Name == "" {
					continue
				}
				if _, ok := pair[[2]string{f, b.Name}]; !ok {
					add("", f, RuleFamilyMissingBucket, "policy family %q has no class for cache bucket %q", f, b.Name)
				}
			}
		}
	}
	if p.DefaultFamily != "" {
		if _, ok := families[p.DefaultFamily]; !ok {
			add("", "", RuleDefaultFamilyUnknown, "default_policy_family %q names no policy family (families: %s)",
				p.DefaultFamily, listOrNone(familyOrder))
		}
	}
	if p.DefaultClass != "" {
		if _, ok := names[p.DefaultClass]; !ok {
			add("", "", RuleDefaultClassUnknown, "default_policy_class %q names no class of policy_classes", p.DefaultClass)
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
