package v1alpha1

// DefaultPoolGroup is the API group a PoolReference names when its group is
// empty: the InferencePool of the Gateway API Inference Extension v1.
const DefaultPoolGroup = "inference.networking.k8s.io"

// PoolReference names the InferencePool a policy object belongs to. The pool
// is always in the object's own namespace: a policy never reaches across
// namespaces.
type PoolReference struct {
	// Group is the API group of the pool.
	// +optional
	// +kubebuilder:default="inference.networking.k8s.io"
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Group string `json:"group,omitempty"`

	// Name is the InferencePool's name in this namespace.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// Condition types and reasons written on PolicyClass and PolicyProfile
// status by the policy controller.
const (
	// ConditionAccepted is True when the pool's whole policy (every class and
	// profile of the pool) is valid and in force, False when it is invalid;
	// the message then carries every rule the object breaks.
	ConditionAccepted = "Accepted"

	// ReasonAccepted: the pool's policy is valid and this object is part of it.
	ReasonAccepted = "Accepted"
	// ReasonInvalid: this object breaks at least one rule; the message names
	// each one. The last valid policy of the pool stays in force.
	ReasonInvalid = "Invalid"
	// ReasonPolicyInvalid: this object is fine, but another object of the
	// same pool is invalid, so the pool keeps its last valid policy and this
	// object's current spec is not in force yet.
	ReasonPolicyInvalid = "PolicyInvalid"
)

// DecimalPattern is the syntax of the decimal-string fields
// (prefillBusyThresholdFrac, busyWorkerRatio): a non-negative decimal number
// with an optional exponent, as strconv.FormatFloat(f, 'g', -1, 64) prints
// it. Brackets rather than backslashes keep it identical in Go, OpenAPI and
// CEL string literals.
const DecimalPattern = `^([0-9]+([.][0-9]*)?|[.][0-9]+)([eE][-+]?[0-9]+)?$`

// DurationPattern is the syntax of a non-negative Go duration string
// (metav1.Duration), as time.Duration.String prints it.
const DurationPattern = `^(0|([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+)$`

// ClassNamePattern is the syntax of a policy class name (SPEC §2).
const ClassNamePattern = `^[A-Za-z0-9_.-]+$`
