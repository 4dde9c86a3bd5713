package policy

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestParseYAMLStrict checks that the loader rejects what the reference
// format does not have, at every level, with the line and path.
func TestParseYAMLStrict(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{
			name: "unknown top-level key",
			yaml: "default_policy_famly: x\n",
			want: []string{`line 1: unknown key "default_policy_famly" (allowed: default_policy_family, uncached_isl_buckets, default_policy_class, policy_classes, models, identity, tenants, default_tenant)`},
		},
		{
			name: "unknown bucket key",
			yaml: "uncached_isl_buckets:\n  - {min_tokens: 0, bucket: a, max_tokens: 9}\n",
			want: []string{`line 2: uncached_isl_buckets[0]: unknown key "max_tokens" (allowed: min_tokens, bucket)`},
		},
		{
			name: "unknown class key",
			yaml: "policy_classes:\n  - name: a\n    quantim: 1\n",
			want: []string{`line 3: policy_classes[0]: unknown key "quantim" (allowed: name, policy_family, cache_bucket, queue_policy, quantum, prefill_busy_threshold, prefill_busy_threshold_frac, busy_worker_ratio, request_queue_limit_per_worker, raw_isl_token_queue_limit_per_worker, cached_token_queue_limit_per_worker, max_queue_wait, tenant_fairness, max_tenants, disaggregate_above_uncached_tokens)`},
		},
		{
			name: "unknown key in a model profile",
			yaml: "models:\n  llama:\n    default_policy_famly: x\n",
			want: []string{`line 3: models["llama"]: unknown key "default_policy_famly" (allowed: default_policy_family, uncached_isl_buckets, default_policy_class, policy_classes)`},
		},
		{
			name: "unknown key in a model profile's class",
			yaml: "models:\n  llama:\n    policy_classes:\n      - {name: a, quantum: 1, colour: red}\n",
			want: []string{`line 4: models["llama"].policy_classes[0]: unknown key "colour" (allowed: name, policy_family, cache_bucket, queue_policy, quantum, prefill_busy_threshold, prefill_busy_threshold_frac, busy_worker_ratio, request_queue_limit_per_worker, raw_isl_token_queue_limit_per_worker, cached_token_queue_limit_per_worker, max_queue_wait, tenant_fairness, max_tenants, disaggregate_above_uncached_tokens)`},
		},
		{
			name: "models do not nest",
			yaml: "models:\n  llama:\n    models: {}\n",
			want: []string{`line 3: models["llama"]: unknown key "models" (allowed: default_policy_family, uncached_isl_buckets, default_policy_class, policy_classes)`},
		},
		{
			name: "repeated key",
			yaml: "policy_classes:\n  - {name: a, quantum: 1, quantum: 2}\n",
			want: []string{`line 2: policy_classes[0]: key "quantum" repeats`},
		},
		{
			name: "wrong type",
			yaml: "policy_classes:\n  - {name: a, quantum: lots}\n",
			want: []string{`line 2: policy_classes[0].quantum: want an integer, got "lots"`},
		},
		{
			name: "float where an integer is wanted",
			yaml: "policy_classes:\n  - {name: a, quantum: 1.5}\n",
			want: []string{`line 2: policy_classes[0].quantum: want an integer, got "1.5"`},
		},
		{
			name: "list where a mapping is wanted",
			yaml: "policy_classes:\n  - [a, b]\n",
			want: []string{`line 2: policy_classes[0]: want a mapping, got a list`},
		},
		{
			name: "mapping where a list is wanted",
			yaml: "policy_classes: {name: a}\n",
			want: []string{`line 1: policy_classes: want a list, got a mapping`},
		},
		{
			name: "top level is not a mapping",
			yaml: "- a\n",
			want: []string{`line 1: want a mapping, got a list`},
		},
		{
			name: "bad duration",
			yaml: "policy_classes:\n  - {name: a, quantum: 1, max_queue_wait: soon}\n",
			want: []string{`line 2: policy_classes[0].max_queue_wait: want a duration such as 30s or 1m30s, got "soon"`},
		},
		{
			name: "two documents",
			yaml: "policy_classes: []\n---\npolicy_classes: []\n",
			want: []string{`line 2: policy YAML has more than one document`},
		},
		{
			name: "merge keys",
			yaml: "policy_classes:\n  - {<<: {quantum: 1}, name: a}\n",
			want: []string{`line 2: policy_classes[0]: merge keys (<<) are not supported`},
		},
		{
			name: "several problems at once",
			yaml: "foo: 1\npolicy_classes:\n  - {name: a, quantum: x, bar: 2}\n",
			want: []string{
				`line 1: unknown key "foo" (allowed: default_policy_family, uncached_isl_buckets, default_policy_class, policy_classes, models, identity, tenants, default_tenant)`,
				`line 3: policy_classes[0].quantum: want an integer, got "x"`,
				`line 3: policy_classes[0]: unknown key "bar" (allowed: name, policy_family, cache_bucket, queue_policy, quantum, prefill_busy_threshold, prefill_busy_threshold_frac, busy_worker_ratio, request_queue_limit_per_worker, raw_isl_token_queue_limit_per_worker, cached_token_queue_limit_per_worker, max_queue_wait, tenant_fairness, max_tenants, disaggregate_above_uncached_tokens)`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseYAML([]byte(tt.yaml))
			var ps Problems
			if !errors.As(err, &ps) {
				t.Fatalf("ParseYAML error = %v, want Problems", err)
			}
			var got []string
			for _, p := range ps {
				got = append(got, p.Message)
				if p.Rule != RuleSyntax {
					t.Errorf("rule = %s, want %s", p.Rule, RuleSyntax)
				}
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("messages:\n got: %q\nwant: %q", got, tt.want)
			}
		})
	}
}

func TestParseYAMLSyntaxError(t *testing.T) {
	_, err := ParseYAML([]byte("policy_classes: [\n"))
	if err == nil || !strings.HasPrefix(err.Error(), "policy YAML: yaml: line") {
		t.Fatalf("ParseYAML = %v, want a YAML syntax error with its line", err)
	}
}

// TestParseYAMLValues checks that every key reaches the model with its value,
// and the defaults of absent keys.
func TestParseYAMLValues(t *testing.T) {
	cfg, err := LoadYAML([]byte(`
default_policy_family: f
uncached_isl_buckets:
  - {min_tokens: 0, bucket: a}
  - {min_tokens: 100, bucket: b}
policy_classes:
  - name: fa
    policy_family: f
    cache_bucket: a
    queue_policy: wspt
    quantum: 7
    prefill_busy_threshold: 1536
    prefill_busy_threshold_frac: 1.25
    busy_worker_ratio: 0.5
    request_queue_limit_per_worker: 1
    raw_isl_token_queue_limit_per_worker: 2
    cached_token_queue_limit_per_worker: 3
    max_queue_wait: 1m30s
    disaggregate_above_uncached_tokens: 256
  - {name: fb, policy_family: f, cache_bucket: b, quantum: 1, queue_policy: ~}
  - {name: x, quantum: 2}
models:
  "meta-llama/Llama-3.1-8B":
    default_policy_class: y
    policy_classes: [{name: y, quantum: 3}]
  empty: {}
`))
	if err != nil {
		t.Fatalf("LoadYAML: %v", err)
	}
	want := &Config{
		Root: Profile{
			DefaultFamily: "f",
			Buckets:       []Bucket{{"a", 0}, {"b", 100}},
			Classes: []Class{
				{
					Name: "fa", Family: "f", Bucket: "a", QueuePolicy: "wspt", Quantum: 7,
					PrefillBusyThreshold: ptr[int64](1536), PrefillBusyThresholdFrac: ptr(1.25), BusyWorkerRatio: ptr(0.5),
					RequestQueueLimitPerWorker: ptr[int64](1), RawISLTokenQueueLimitPerWorker: ptr[int64](2),
					CachedTokenQueueLimitPerWorker: ptr[int64](3), MaxQueueWait: 90 * time.Second,
					DisaggregateAboveUncachedTokens: ptr[int64](256),
				},
				{Name: "fb", Family: "f", Bucket: "b", QueuePolicy: "edf", Quantum: 1},
				{Name: "x", QueuePolicy: "edf", Quantum: 2},
			},
		},
		Models: []ModelProfile{
			{Model: "meta-llama/Llama-3.1-8B", Profile: Profile{DefaultClass: "y", Classes: []Class{{Name: "y", QueuePolicy: "edf", Quantum: 3}}}},
			{Model: "empty"},
		},
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("LoadYAML:\n got %+v\nwant %+v", cfg, want)
	}
}

func TestParseYAMLEmpty(t *testing.T) {
	for _, in := range []string{"", "\n", "# comment\n", "~\n", "---\n"} {
		cfg, err := LoadYAML([]byte(in))
		if err != nil {
			t.Fatalf("LoadYAML(%q): %v", in, err)
		}
		if !reflect.DeepEqual(cfg, &Config{}) {
			t.Errorf("LoadYAML(%q) = %+v, want the empty Config", in, cfg)
		}
	}
}

func TestParseYAMLAliases(t *testing.T) {
	cfg, err := LoadYAML([]byte(`
policy_classes: &classes
  - {name: a, quantum: 1}
models:
  m: {policy_classes: *classes}
`))
	if err != nil {
		t.Fatalf("LoadYAML: %v", err)
	}
	if len(cfg.Models) != 1 || len(cfg.Models[0].Profile.Classes) != 1 || cfg.Models[0].Profile.Classes[0].Name != "a" {
		t.Errorf("alias not followed: %+v", cfg)
	}
}

func TestLoadFile(t *testing.T) {
	if _, err := LoadFile("testdata/does-not-exist.yaml"); err == nil || !strings.Contains(err.Error(), "does-not-exist.yaml") {
		t.Errorf("LoadFile of a missing file = %v, want an error naming it", err)
	}
	_, err := LoadFile("../../config/samples/policy-cache-buckets.yaml")
	if err != nil {
		t.Errorf("LoadFile(sample): %v", err)
	}
}
