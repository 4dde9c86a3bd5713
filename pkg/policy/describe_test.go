package policy

import (
	"bytes"
	"strings"
	"testing"
)

// noIdentityLine is the line Describe ends with for a policy without an
// identity source.
const noIdentityLine = "no identity configured: the x-laneway-tenant header names the tenant and client hints are trusted as sent\n"

func TestDescribe(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{
			name: "no policy",
			want: "class \"default\": synthetic (no policy classes), policy fcfs, quantum 1, no busy threshold (never queues)\n" + noIdentityLine,
		},
		{
			name: "families, buckets, limits, wait, tenant-fair",
			yaml: `
default_policy_family: std
uncached_isl_buckets: [{min_tokens: 0, bucket: short}, {min_tokens: 2048, bucket: long}]
policy_classes:
  - {name: s, policy_family: std, cache_bucket: short, quantum: 512, queue_policy: wspt, prefill_busy_threshold: 1024, max_queue_wait: 30s}
  - {name: l, policy_family: std, cache_bucket: long, quantum: 128, prefill_busy_threshold_frac: 0.5, raw_isl_token_queue_limit_per_worker: 65536, tenant_fairness: true, max_tenants: 5}
  - {name: batch, quantum: 4, prefill_busy_threshold: none, request_queue_limit_per_worker: 0, cached_token_queue_limit_per_worker: 7, disaggregate_above_uncached_tokens: 1024}
`,
			want: `class "s": family std, bucket short (uncached >= 0), policy wspt, quantum 512, threshold 1024 tokens, max queue wait 30s
class "l": family std, bucket long (uncached >= 2048), policy edf, quantum 128, threshold 0.5 × max_num_batched_tokens, limit raw_isl_tokens 65536/worker, tenant-fair (at most 5 tenants)
class "batch": explicit, policy edf, quantum 4, no busy threshold (never queues), limit requests 0/worker, limit cached_tokens 7/worker, disaggregated above 1024 uncached tokens
` + noIdentityLine,
		},
		{
			name: "a model profile's bucket bound is its own",
			yaml: `
policy_classes: [{name: a, quantum: 1, prefill_busy_threshold: none}]
models:
  m:
    default_policy_family: f
    uncached_isl_buckets: [{min_tokens: 0, bucket: x}, {min_tokens: 99, bucket: y}]
    policy_classes:
      - {name: fx, policy_family: f, cache_bucket: x, quantum: 2, prefill_busy_threshold: none}
      - {name: fy, policy_family: f, cache_bucket: y, quantum: 3, prefill_busy_threshold: none}
`,
			want: `class "a": explicit, policy edf, quantum 1, no busy threshold (never queues)
model "m": class "fx": family f, bucket x (uncached >= 0), policy edf, quantum 2, no busy threshold (never queues)
model "m": class "fy": family f, bucket y (uncached >= 99), policy edf, quantum 3, no busy threshold (never queues)
` + noIdentityLine,
		},
		{
			name: "tenants with an identity: caps default to 0, a shadowed binding says so",
			yaml: `
identity: {header: x-tenant-id, anonymous: nobody}
tenants:
  - {name: acme, match: {exact: [acme], prefix: [acme-]}, allowed: [a, b], default_family: b, weight: 3, max_priority: 10, request_queue_limit: 5, raw_isl_token_queue_limit: 9}
  - {name: acme-x, match: {exact: [acme-x]}}
  - {name: other, match: {exact: [acme, other]}, default_family: a}
default_tenant: {allowed: [b], default_family: b, max_strict_priority: 2}
policy_classes: [{name: a, quantum: 1, prefill_busy_threshold: none}, {name: b, quantum: 1, prefill_busy_threshold: none}]
`,
			want: `class "a": explicit, policy edf, quantum 1, no busy threshold (never queues)
class "b": explicit, policy edf, quantum 1, no busy threshold (never queues)
tenant "acme": identities acme, acme-*; allowed a, b (default b); weight 3; caps priority 10, strict 0; limits 5 requests, 9 raw_isl_tokens per class
tenant "acme-x": identities acme-x; any class; weight 1; caps priority 0, strict 0; never matches: tenant "acme" comes first for every identity it selects
tenant "other": identities acme, other; any class (default a); weight 1; caps priority 0, strict 0
default tenant: allowed b (default b); weight 1; caps priority 0, strict 2
identity from header x-tenant-id; requests without one are tenant "nobody"
`,
		},
		{
			name: "tenants without an identity: no caps unless set",
			yaml: `
tenants: [{name: batch, match: {prefix: [batch-]}, max_strict_priority: 2}]
policy_classes: [{name: a, quantum: 1, prefill_busy_threshold: none}]
`,
			want: `class "a": explicit, policy edf, quantum 1, no busy threshold (never queues)
tenant "batch": identities batch-*; any class; weight 1; caps priority none, strict 2
` + noIdentityLine,
		},
		{
			name: "a class without a threshold is auto; auto and none can be written",
			yaml: `
policy_classes:
  - {name: a, quantum: 1}
  - {name: b, quantum: 1, prefill_busy_threshold: auto, busy_worker_ratio: 0.5}
  - {name: c, quantum: 1, prefill_busy_threshold: none}
`,
			want: `class "a": explicit, policy edf, quantum 1, threshold auto (follows the engine, starts at max_num_batched_tokens)
class "b": explicit, policy edf, quantum 1, threshold auto (follows the engine, starts at max_num_batched_tokens), busy_worker_ratio 0.5
class "c": explicit, policy edf, quantum 1, no busy threshold (never queues)
` + noIdentityLine,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := LoadYAML([]byte(tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if err := cfg.Describe(&out); err != nil {
				t.Fatal(err)
			}
			if out.String() != tt.want {
				t.Errorf("got:\n%s\nwant:\n%s", out.String(), tt.want)
			}
		})
	}
}

func TestDescribeInvalid(t *testing.T) {
	cfg := &Config{Root: Profile{Classes: []Class{{Name: "a", QueuePolicy: QueuePolicyFCFS}}}}
	var out bytes.Buffer
	if err := cfg.Describe(&out); err == nil || !strings.Contains(err.Error(), "quantum must be > 0") || out.Len() != 0 {
		t.Errorf("Describe of an invalid policy: error %v, output %q; want the problem and no output", err, out.String())
	}
}
