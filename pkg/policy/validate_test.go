package policy

import (
	"errors"
	"strings"
	"testing"
)

// twoBuckets is a valid prefix: one family "standard" with buckets cached
// (0) and uncached (3072). Cases append classes to it.
const twoBuckets = `
default_policy_family: standard
uncached_isl_buckets:
  - {min_tokens: 0, bucket: cached}
  - {min_tokens: 3072, bucket: uncached}
policy_classes:
  - {name: cached, policy_family: standard, cache_bucket: cached, quantum: 2048}
  - {name: uncached, policy_family: standard, cache_bucket: uncached, quantum: 512}
`

// TestValidateRules covers every invalid configuration of SPEC §2, plus the
// loader's own rules, asserting the exact message each one produces.
func TestValidateRules(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string // every message, in order
		rule Rule     // the rule of the first message
	}{
		{
			name: "family lacks a class for a bucket",
			yaml: `
default_policy_family: standard
uncached_isl_buckets: [{min_tokens: 0, bucket: cached}, {min_tokens: 3072, bucket: uncached}]
policy_classes:
  - {name: cached, policy_family: standard, cache_bucket: cached, quantum: 1}
`,
			want: []string{`policy family "standard" has no class for cache bucket "uncached"`},
			rule: RuleFamilyMissingBucket,
		},
		{
			name: "family/bucket pair has two classes",
			yaml: twoBuckets + `  - {name: cached2, policy_family: standard, cache_bucket: cached, quantum: 1}
`,
			want: []string{`class "cached2": policy family "standard" already has a class for cache bucket "cached" (class "cached")`},
			rule: RuleDuplicateFamilyBucket,
		},
		{
			name: "malformed name",
			yaml: `policy_classes: [{name: "gold class", quantum: 1}]`,
			want: []string{`class "gold class": name must match [A-Za-z0-9_.-]+`},
			rule: RuleNameMalformed,
		},
		{
			name: "missing name",
			yaml: `policy_classes: [{quantum: 1}]`,
			want: []string{`policy_classes[0]: name is required`},
			rule: RuleNameMalformed,
		},
		{
			name: "duplicated name",
			yaml: `policy_classes: [{name: gold, quantum: 1}, {name: gold, quantum: 2}]`,
			want: []string{`class "gold": name is used by more than one class (policy_classes[0] and [1])`},
			rule: RuleNameDuplicate,
		},
		{
			name: "unknown bucket",
			yaml: twoBuckets + `  - {name: x, policy_family: other, cache_bucket: medium, quantum: 1}
`,
			want: []string{
				`class "x": cache_bucket "medium" is not a bucket of uncached_isl_buckets (cached, uncached)`,
				`policy family "other" has no class for cache bucket "cached"`,
				`policy family "other" has no class for cache bucket "uncached"`,
			},
			rule: RuleUnknownBucket,
		},
		{
			name: "family without bucket",
			yaml: twoBuckets + `  - {name: x, policy_family: standard, quantum: 1}
`,
			want: []string{`class "x": policy_family and cache_bucket must be set together, or neither for an explicit class (policy_family "standard", cache_bucket "")`},
			rule: RuleFamilyBucketTogether,
		},
		{
			name: "bucket without family",
			yaml: twoBuckets + `  - {name: x, cache_bucket: cached, quantum: 1}
`,
			want: []string{`class "x": policy_family and cache_bucket must be set together, or neither for an explicit class (policy_family "", cache_bucket "cached")`},
			rule: RuleFamilyBucketTogether,
		},
		{
			name: "explicit class name equals a family name",
			yaml: twoBuckets + `  - {name: standard, quantum: 1}
`,
			want: []string{`class "standard": explicit class name equals policy family "standard"; a class header naming it would be ambiguous`},
			rule: RuleExplicitNameIsFamily,
		},
		{
			name: "first bucket does not start at 0",
			yaml: `
default_policy_family: f
uncached_isl_buckets: [{min_tokens: 1, bucket: a}]
policy_classes: [{name: a, policy_family: f, cache_bucket: a, quantum: 1}]
`,
			want: []string{`uncached_isl_buckets[0] ("a"): the first bucket's min_tokens must be 0 (got 1)`},
			rule: RuleFirstBucketNotZero,
		},
		{
			name: "bucket names repeat",
			yaml: `
default_policy_family: f
uncached_isl_buckets: [{min_tokens: 0, bucket: a}, {min_tokens: 10, bucket: a}]
policy_classes: [{name: a, policy_family: f, cache_bucket: a, quantum: 1}]
`,
			want: []string{`uncached_isl_buckets[1] ("a"): bucket name "a" repeats (also uncached_isl_buckets[0])`},
			rule: RuleBucketNameRepeats,
		},
		{
			name: "min_tokens not strictly increasing",
			yaml: `
default_policy_family: f
uncached_isl_buckets: [{min_tokens: 0, bucket: a}, {min_tokens: 100, bucket: b}, {min_tokens: 100, bucket: c}]
policy_classes:
  - {name: a, policy_family: f, cache_bucket: a, quantum: 1}
  - {name: b, policy_family: f, cache_bucket: b, quantum: 1}
  - {name: c, policy_family: f, cache_bucket: c, quantum: 1}
`,
			want: []string{`uncached_isl_buckets[2] ("c"): min_tokens must be strictly increasing (got 100 after 100)`},
			rule: RuleBucketsNotIncreasing,
		},
		{
			name: "quantum 0",
			yaml: `policy_classes: [{name: gold, quantum: 0}]`,
			want: []string{`class "gold": quantum must be > 0 (got 0)`},
			rule: RuleQuantum,
		},
		{
			name: "quantum absent",
			yaml: `policy_classes: [{name: gold}]`,
			want: []string{`class "gold": quantum must be > 0 (got 0)`},
			rule: RuleQuantum,
		},
		{
			name: "negative quantum",
			yaml: `policy_classes: [{name: gold, quantum: -5}]`,
			want: []string{`class "gold": quantum must be > 0 (got -5)`},
			rule: RuleQuantum,
		},
		{
			name: "unknown queue policy",
			yaml: `policy_classes: [{name: gold, quantum: 1, queue_policy: lifo}]`,
			want: []string{`class "gold": queue_policy "lifo" is unknown (want fcfs, wspt or edf)`},
			rule: RuleQueuePolicy,
		},
		{
			name: "default family names no family",
			yaml: `
default_policy_family: premium
uncached_isl_buckets: [{min_tokens: 0, bucket: all}]
policy_classes: [{name: regular, policy_family: regular, cache_bucket: all, quantum: 1}]
`,
			want: []string{`default_policy_family "premium" names no policy family (families: regular)`},
			rule: RuleDefaultFamilyUnknown,
		},
		{
			name: "busy_worker_ratio above 1",
			yaml: `policy_classes: [{name: gold, quantum: 1, prefill_busy_threshold: 10, busy_worker_ratio: 1.5}]`,
			want: []string{`class "gold": busy_worker_ratio must be > 0 and <= 1 (got 1.5)`},
			rule: RuleBusyWorkerRatio,
		},
		{
			name: "busy_worker_ratio 0",
			yaml: `policy_classes: [{name: gold, quantum: 1, prefill_busy_threshold_frac: 0.5, busy_worker_ratio: 0}]`,
			want: []string{`class "gold": busy_worker_ratio must be > 0 and <= 1 (got 0)`},
			rule: RuleBusyWorkerRatio,
		},
		{
			name: "busy_worker_ratio NaN",
			yaml: `policy_classes: [{name: gold, quantum: 1, prefill_busy_threshold: 1, busy_worker_ratio: .nan}]`,
			want: []string{`class "gold": busy_worker_ratio must be > 0 and <= 1 (got NaN)`},
			rule: RuleBusyWorkerRatio,
		},
		{
			name: "busy_worker_ratio without a threshold",
			yaml: `policy_classes: [{name: gold, quantum: 1, busy_worker_ratio: 0.5}]`,
			want: []string{`class "gold": busy_worker_ratio is set without a threshold: set prefill_busy_threshold or prefill_busy_threshold_frac`},
			rule: RuleRatioWithoutThreshold,
		},
		{
			name: "families without default family and buckets",
			yaml: `policy_classes: [{name: gold, policy_family: gold, cache_bucket: all, quantum: 1}]`,
			want: []string{`class "gold": names a policy family, so default_policy_family and uncached_isl_buckets are required`},
			rule: RuleFamilySettingsRequired,
		},
		{
			name: "default family without buckets",
			yaml: `
default_policy_family: gold
policy_classes: [{name: gold, policy_family: gold, cache_bucket: all, quantum: 1}]
`,
			want: []string{`default_policy_family and uncached_isl_buckets go together: set both or neither (default_policy_family "gold", 0 buckets)`},
			rule: RuleFamilySettingsTogether,
		},
		{
			name: "default class names no class",
			yaml: `
default_policy_class: platinum
policy_classes: [{name: gold, quantum: 1}]
`,
			want: []string{`default_policy_class "platinum" names no class of policy_classes`},
			rule: RuleDefaultClassUnknown,
		},
		{
			name: "threshold frac infinite",
			yaml: `policy_classes: [{name: gold, quantum: 1, prefill_busy_threshold_frac: .inf}]`,
			want: []string{`class "gold": prefill_busy_threshold_frac must be finite and >= 0 (got +Inf)`},
			rule: RuleThresholdFrac,
		},
		{
			name: "threshold frac negative",
			yaml: `policy_classes: [{name: gold, quantum: 1, prefill_busy_threshold_frac: -0.5}]`,
			want: []string{`class "gold": prefill_busy_threshold_frac must be finite and >= 0 (got -0.5)`},
			rule: RuleThresholdFrac,
		},
		{
			name: "negative threshold and limits",
			yaml: `policy_classes: [{name: gold, quantum: 1, prefill_busy_threshold: -1, request_queue_limit_per_worker: -2, raw_isl_token_queue_limit_per_worker: -3, cached_token_queue_limit_per_worker: -4, max_queue_wait: -1s, disaggregate_above_uncached_tokens: -5}]`,
			want: []string{
				`class "gold": prefill_busy_threshold must be >= 0 (got -1)`,
				`class "gold": request_queue_limit_per_worker must be >= 0 (got -2)`,
				`class "gold": raw_isl_token_queue_limit_per_worker must be >= 0 (got -3)`,
				`class "gold": cached_token_queue_limit_per_worker must be >= 0 (got -4)`,
				`class "gold": disaggregate_above_uncached_tokens must be >= 0 (got -5)`,
				`class "gold": max_queue_wait must be >= 0 (got -1s)`,
			},
			rule: RuleNegative,
		},
		{
			name: "problem inside a model profile names the model",
			yaml: `
policy_classes: [{name: gold, quantum: 1}]
models:
  llama:
    policy_classes: [{name: gold, quantum: 0}]
`,
			want: []string{`model "llama": class "gold": quantum must be > 0 (got 0)`},
			rule: RuleQuantum,
		},
		{
			name: "every problem is reported",
			yaml: `
policy_classes:
  - {name: a, quantum: 0, queue_policy: x}
  - {name: "b!", quantum: 1}
`,
			want: []string{
				`class "a": queue_policy "x" is unknown (want fcfs, wspt or edf)`,
				`class "a": quantum must be > 0 (got 0)`,
				`class "b!": name must match [A-Za-z0-9_.-]+`,
			},
			rule: RuleQueuePolicy,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := LoadYAML([]byte(tt.yaml))
			if err == nil {
				t.Fatalf("LoadYAML accepted an invalid policy: %+v", cfg)
			}
			var ps Problems
			if !errors.As(err, &ps) {
				t.Fatalf("error %v (%T) is not Problems", err, err)
			}
			var got []string
			for _, p := range ps {
				got = append(got, p.Message)
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("messages:\n got: %q\nwant: %q", got, tt.want)
			}
			if ps[0].Rule != tt.rule {
				t.Errorf("first rule = %s, want %s", ps[0].Rule, tt.rule)
			}
			if err.Error() != strings.Join(tt.want, "\n") {
				t.Errorf("Error() = %q, want the messages one per line", err.Error())
			}
		})
	}
}

// TestValidateAcceptsSeedShapes checks configurations SPEC §2 calls valid.
func TestValidateAcceptsSeedShapes(t *testing.T) {
	tests := []struct{ name, yaml string }{
		{"no policy at all", ``},
		{"only comments", "# nothing here\n"},
		{"explicit classes only", `policy_classes: [{name: standard, quantum: 1, queue_policy: fcfs, prefill_busy_threshold_frac: 1.0}]`},
		{"two buckets", twoBuckets},
		{"frac above 1 is normal", `policy_classes: [{name: a, quantum: 1, prefill_busy_threshold_frac: 2.5, busy_worker_ratio: 1}]`},
		{"limit of 0 is allowed", `policy_classes: [{name: a, quantum: 1, prefill_busy_threshold: 0, request_queue_limit_per_worker: 0}]`},
		{"same class name in root and model profile", `
policy_classes: [{name: a, quantum: 1}]
models: {m: {policy_classes: [{name: a, quantum: 2}]}}
`},
		{"explicit class beside families", twoBuckets + "  - {name: batch, quantum: 1}\n"},
		{"class named like its own family", `
default_policy_family: premium
uncached_isl_buckets: [{min_tokens: 0, bucket: all}]
policy_classes: [{name: premium, policy_family: premium, cache_bucket: all, quantum: 1}]
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := LoadYAML([]byte(tt.yaml)); err != nil {
				t.Fatalf("LoadYAML: %v", err)
			}
		})
	}
}

// TestValidateModelNames covers the rules only a Config built in code (or
// from objects) can break: a model profile without a name or twice.
func TestValidateModelNames(t *testing.T) {
	cfg := &Config{Models: []ModelProfile{{Model: ""}, {Model: "m"}, {Model: "m"}}}
	err := cfg.Validate()
	want := "models[0]: model name is empty\nmodel \"m\": more than one profile for this model"
	if err == nil || err.Error() != want {
		t.Fatalf("Validate() = %v, want %q", err, want)
	}
}
