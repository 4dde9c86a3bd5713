// Package v1alpha1 holds the laneway.dev/v1alpha1 API: the custom resources
// that describe a pool's policy classes and tenant rules in Kubernetes mode
// (SPEC §2, §14).
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
// Tenant rules (SPEC §14: where identity comes from, the tenant bindings
// and the binding for everyone else) are fields of PolicyProfile
// (spec.identity, spec.tenants, spec.defaultTenant), not a kind of their
// own. A binding grants privileges: which classes a caller may use, how
// high its hints may go, its weight against the other tenants. Grants must
// be written by whoever owns the pool's policy and judged together with
// the classes they name, in one step: with a separate namespaced kind
// (a PolicyTenant with a poolRef), anyone allowed to create objects of
// that kind in the namespace could bind their own identity to premium,
// and the order of the bindings (first match wins) would have to come
// from object names. A list in the one admin-owned object keeps the order
// explicit, lets the API server check name uniqueness (listType=map), and
// is validated with the classes as one set, so a binding naming a class
// that does not exist holds back the whole change, as any other invalid
// object does. The classes' side (tenantFairness, maxTenants) is a PolicyClass
// field like every other per-class setting. Bounds (at most 10,000
// bindings, as pkg/policy allows) keep objects and CEL costs bounded.
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
// (0,1] and only with a threshold, bucket ordering, maxTenants only with
// tenantFairness, an identity source, a non-empty match, defaultFamily
// with allowed, the weight and cap ranges) are enforced at admission by
// OpenAPI and CEL validation in the generated CRDs. The CRDs are slightly
// stricter than the YAML loader where the YAML accepts what cannot work:
// an identity header must be an HTTP token, and list entries (exact
// identities, allowed classes, path keys) must not be empty. Rules that
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
