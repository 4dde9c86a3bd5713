package workload

import "fmt"

// PolicyYAML is the SPEC §11 policy in the reference router's file format:
// the classes premium and regular, one shared cache bucket, FCFS lanes, a
// prefill-busy threshold of 1536 tokens, and the two quanta given. Requests
// without a class fall to regular.
func PolicyYAML(premiumQuantum, regularQuantum uint64) string {
	return PolicyYAMLThreshold(premiumQuantum, regularQuantum, "1536")
}

// PolicyYAMLThreshold is PolicyYAML with another prefill_busy_threshold
// for both classes: a token count, auto or none.
func PolicyYAMLThreshold(premiumQuantum, regularQuantum uint64, threshold string) string {
	return fmt.Sprintf(`# Weighted-share policy (SPEC §11), quanta premium:regular %[1]d:%[2]d.
default_policy_family: regular
uncached_isl_buckets:
  - min_tokens: 0
    bucket: all
policy_classes:
  - name: premium
    policy_family: premium
    cache_bucket: all
    queue_policy: fcfs
    quantum: %[1]d
    prefill_busy_threshold: %[3]s
    request_queue_limit_per_worker: 1024
  - name: regular
    policy_family: regular
    cache_bucket: all
    queue_policy: fcfs
    quantum: %[2]d
    prefill_busy_threshold: %[3]s
    request_queue_limit_per_worker: 1024
`, premiumQuantum, regularQuantum, threshold)
}
