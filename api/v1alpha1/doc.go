// Package v1alpha1 holds the laneway.dev/v1alpha1 API: the custom resources
// that describe a pool's policy classes in Kubernetes mode (SPEC §2).
//
// A policy has two halves, and each half is one kind:
//
//   - PolicyClass: one object per physical class (the unit the DRR scheduler
//     arbitrates between). It carries everything the reference YAML says
//     about one entry of policy_classes, plus a queue-wait budget
//     (maxQueueWait). Operators add, tune and remove classes one object at a
//     time, and each class reports its own status (Accepted, pending count).
//   - PolicyProfile: one object per InferencePool for the settings that
//     belong to no single class: the default policy family, the default
//     class, and the uncached-ISL bucket boundaries. Putting them on a class
//     object would force a choice of which class owns them and let two
//     classes disagree; putting them on the InferencePool is impossible (an
//     upstream type). A separate, pool-scoped kind gives them one home that
//     can be validated at admission on its own (first bucket at 0, strictly
//     increasing boundaries, unique bucket names).
//
// Model-name profiles (the YAML `models:` map, where a profile for an exact
// model name replaces the root profile) are expressed on both kinds: a
// PolicyClass with spec.model set belongs to that model's profile instead of
// the root one, and PolicyProfile.spec.models lists each model profile's
// pool-level settings. Class names only have to be unique within one
// profile, exactly as in the YAML.
//
// Rules that concern a single object (quantum >= 1, queue policy enum, the
// class-name pattern, family and bucket set together, busy-worker ratio in
// (0,1] and only with a threshold, bucket ordering) are enforced at
// admission by OpenAPI and CEL validation in the generated CRDs. Rules that
// span objects (a family missing a bucket, duplicate names, an unknown
// bucket, a default family with no classes) cannot be checked at admission;
// pkg/policy converts a pool's objects to its policy model and reports them
// as Accepted=False status conditions with the same messages as the YAML
// loader.
//
// The busy fractions and ratios are decimal strings rather than floats
// because Kubernetes API conventions avoid floating-point fields; their
// syntax and ranges are validated at admission.
//
// +kubebuilder:object:generate=true
// +groupName=laneway.dev
package v1alpha1
