package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// QueuePolicy orders the requests inside one lane of a class (SPEC §3).
// +kubebuilder:validation:Enum=fcfs;wspt;edf
type QueuePolicy string

// The queue policies.
const (
	// QueuePolicyFCFS: arrival order, with the soft priority as a bump of
	// that many seconds of earlier arrival.
	QueuePolicyFCFS QueuePolicy = "fcfs"
	// QueuePolicyWSPT: (1 + priority) / scheduling cost, higher first.
	QueuePolicyWSPT QueuePolicy = "wspt"
	// QueuePolicyEDF: earliest due time first, then arrival; ignores both
	// priorities. It is the default, as in the reference router.
	QueuePolicyEDF QueuePolicy = "edf"
)

// PolicyClassSpec is one physical policy class: one entry of the reference
// YAML's policy_classes list, tied to a pool.
//
// +kubebuilder:validation:XValidation:rule="has(self.policyFamily) == has(self.cacheBucket)",message="policyFamily and cacheBucket must be set together: both for a family class, neither for an explicit class"
// +kubebuilder:validation:XValidation:rule="!has(self.busyWorkerRatio) || (has(self.prefillBusyThreshold) && (type(self.prefillBusyThreshold) == int || self.prefillBusyThreshold != 'none')) || has(self.prefillBusyThresholdFrac)",message="busyWorkerRatio needs a busy threshold: set prefillBusyThreshold or prefillBusyThresholdFrac too"
// +kubebuilder:validation:XValidation:rule="!has(self.prefillBusyThreshold) || !has(self.prefillBusyThresholdFrac) || type(self.prefillBusyThreshold) == int",message="prefillBusyThreshold auto or none cannot go with prefillBusyThresholdFrac"
// +kubebuilder:validation:XValidation:rule="!has(self.maxTenants) || (has(self.tenantFairness) && self.tenantFairness)",message="maxTenants needs tenantFairness: true"
type PolicyClassSpec struct {
	// PoolRef is the InferencePool (same namespace) whose policy this class
	// belongs to. It cannot change: create a new object to move a class.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="poolRef is immutable; create a new PolicyClass for another pool"
	PoolRef PoolReference `json:"poolRef"`

	// Model, when set, puts the class in the profile of requests for exactly
	// this model name (the YAML's models map); such a profile replaces the
	// pool's root profile for those requests. Empty: the root profile.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Model string `json:"model,omitempty"`

	// ClassName is the class's name in the policy: the value a request's
	// class header names for an explicit class, and the policy_class label
	// of its metrics. Empty: the object's metadata.name. Unique per profile.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.-]+$`
	ClassName string `json:"className,omitempty"`

	// PolicyFamily is the family this class serves for one cache bucket.
	// Set together with cacheBucket; leave both empty for an explicit class
	// that requests select by its className.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	PolicyFamily string `json:"policyFamily,omitempty"`

	// CacheBucket is the uncached-ISL bucket (a name from the pool's
	// PolicyProfile) this class serves within its family.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	CacheBucket string `json:"cacheBucket,omitempty"`

	// QueuePolicy orders the class's queued requests.
	// +optional
	// +kubebuilder:default=edf
	QueuePolicy QueuePolicy `json:"queuePolicy,omitempty"`

	// Quantum is the DRR credit, in uncached prompt tokens, the class earns
	// per ring round; classes share queued service in proportion to it.
	// +required
	// +kubebuilder:validation:Minimum=1
	Quantum int64 `json:"quantum"`

	// PrefillBusyThreshold makes an endpoint busy for this class when its
	// active prefill tokens exceed this many; "auto" (the default when
	// neither this nor prefillBusyThresholdFrac is set) lets the threshold
	// follow each engine, and "none" makes the class never queue.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self in ['auto', 'none']",message="should be greater than or equal to 0, or auto or none"
	PrefillBusyThreshold *intstr.IntOrString `json:"prefillBusyThreshold,omitempty"`

	// PrefillBusyThresholdFrac makes an endpoint busy when its active
	// prefill tokens exceed this fraction of its max_num_batched_tokens.
	// A non-negative decimal string such as "0.75" or "1.5" (values above 1
	// are normal).
	// +optional
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+([.][0-9]*)?|[.][0-9]+)([eE][-+]?[0-9]+)?$`
	PrefillBusyThresholdFrac *string `json:"prefillBusyThresholdFrac,omitempty"`

	// BusyWorkerRatio relaxes the busy test of a shared head: it waits only
	// while at least this fraction of its eligible endpoints is busy
	// (instead of all of them). A decimal string in (0, 1], such as "0.5".
	// Needs a threshold.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+([.][0-9]*)?|[.][0-9]+)([eE][-+]?[0-9]+)?$`
	// +kubebuilder:validation:XValidation:rule="!self.matches('^([0-9]+([.][0-9]*)?|[.][0-9]+)([eE][-+]?[0-9]+)?$') || (double(self) > 0.0 && double(self) <= 1.0)",message="busyWorkerRatio must be greater than 0 and at most 1"
	BusyWorkerRatio *string `json:"busyWorkerRatio,omitempty"`

	// RequestQueueLimitPerWorker bounds the class's queued requests, per
	// endpoint of the pool. Absent: unbounded; 0 rejects every queued
	// request.
	// +optional
	// +kubebuilder:validation:Minimum=0
	RequestQueueLimitPerWorker *int64 `json:"requestQueueLimitPerWorker,omitempty"`

	// RawISLTokenQueueLimitPerWorker bounds the class's queued prompt
	// tokens, per endpoint of the pool.
	// +optional
	// +kubebuilder:validation:Minimum=0
	RawISLTokenQueueLimitPerWorker *int64 `json:"rawISLTokenQueueLimitPerWorker,omitempty"`

	// CachedTokenQueueLimitPerWorker bounds the class's queued prefix-cached
	// tokens, per endpoint of the pool.
	// +optional
	// +kubebuilder:validation:Minimum=0
	CachedTokenQueueLimitPerWorker *int64 `json:"cachedTokenQueueLimitPerWorker,omitempty"`

	// MaxQueueWait sheds a queued request (HTTP 429) once it has waited this
	// long; under edf it is also the deadline of a request that brings none.
	// Absent or 0: unbounded.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^(0|([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+)$`
	MaxQueueWait *metav1.Duration `json:"maxQueueWait,omitempty"`

	// TenantFairness shares the class between its tenants (SPEC §14): one
	// sub-queue per tenant, served by DRR on uncached tokens with the
	// class quantum times each tenant's weight, instead of one queue for
	// all.
	// +optional
	TenantFairness bool `json:"tenantFairness,omitempty"`

	// MaxTenants bounds the tenants with queued requests in a tenant-fair
	// class; a request of one more tenant gets 429 (limit_kind tenants).
	// Absent: 10000.
	// +optional
	// +kubebuilder:validation:Minimum=1
	MaxTenants *int64 `json:"maxTenants,omitempty"`

	// DisaggregateAboveUncachedTokens: in a pool with prefill pods (pod
	// label llm-d.ai/role: prefill), a request of the class whose uncached
	// prompt tokens are above this is prefilled on a prefill pod and
	// decoded on a decode pod; at or below it the decode pod prefills it
	// itself. Absent: the picker's --disaggregate-above-uncached-tokens.
	// +optional
	// +kubebuilder:validation:Minimum=0
	DisaggregateAboveUncachedTokens *int64 `json:"disaggregateAboveUncachedTokens,omitempty"`
}

// PolicyClassStatus is what the policy controller observed for the class.
type PolicyClassStatus struct {
	// Conditions: Accepted (see ConditionAccepted).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`

	// ObservedGeneration is the metadata.generation the conditions describe.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Pending is the class's current count of queued requests.
	// +optional
	Pending int64 `json:"pending,omitempty"`
}

// PolicyClass is one physical policy class of an InferencePool's policy.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=lwpc,categories=laneway
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.poolRef.name`,priority=1
// +kubebuilder:printcolumn:name="Model",type=string,JSONPath=`.spec.model`,priority=1
// +kubebuilder:printcolumn:name="Class",type=string,JSONPath=`.spec.className`,priority=1
// +kubebuilder:printcolumn:name="Family",type=string,JSONPath=`.spec.policyFamily`
// +kubebuilder:printcolumn:name="Bucket",type=string,JSONPath=`.spec.cacheBucket`
// +kubebuilder:printcolumn:name="Policy",type=string,JSONPath=`.spec.queuePolicy`
// +kubebuilder:printcolumn:name="Quantum",type=integer,JSONPath=`.spec.quantum`
// +kubebuilder:printcolumn:name="Threshold",type=integer,JSONPath=`.spec.prefillBusyThreshold`
// +kubebuilder:printcolumn:name="Frac",type=string,JSONPath=`.spec.prefillBusyThresholdFrac`,priority=1
// +kubebuilder:printcolumn:name="Tenant Fair",type=boolean,JSONPath=`.spec.tenantFairness`,priority=1
// +kubebuilder:printcolumn:name="Max Tenants",type=integer,JSONPath=`.spec.maxTenants`,priority=1
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="Pending",type=integer,JSONPath=`.status.pending`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type PolicyClass struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the class as the operator configures it.
	// +required
	Spec PolicyClassSpec `json:"spec"`
	// Status is written by the policy controller.
	// +optional
	Status PolicyClassStatus `json:"status,omitempty"`
}

// EffectiveClassName is the class's name in the policy: spec.className, or
// metadata.name when that is empty.
func (c *PolicyClass) EffectiveClassName() string {
	if c.Spec.ClassName != "" {
		return c.Spec.ClassName
	}
	return c.Name
}

// PolicyClassList is a list of PolicyClass objects.
//
// +kubebuilder:object:root=true
type PolicyClassList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the classes.
	Items []PolicyClass `json:"items"`
}
