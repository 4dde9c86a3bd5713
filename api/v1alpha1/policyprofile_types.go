package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CacheBucket is one uncached-ISL bucket: a request whose uncached prompt
// tokens are at least MinTokens (and below the next bucket's MinTokens)
// falls in it.
type CacheBucket struct {
	// Name is the bucket's name, as PolicyClass.spec.cacheBucket names it.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// MinTokens is the bucket's lower bound in uncached tokens; the first
	// bucket's is 0.
	// +required
	// +kubebuilder:validation:Minimum=0
	MinTokens int64 `json:"minTokens"`
}

// PolicyProfileSpec holds the pool-level policy settings: those of the root
// profile, and those of each model profile.
//
// +kubebuilder:validation:XValidation:rule="has(self.defaultPolicyFamily) == has(self.uncachedISLBuckets)",message="defaultPolicyFamily and uncachedISLBuckets go together: set both when classes name a policy family, neither otherwise"
type PolicyProfileSpec struct {
	// PoolRef is the InferencePool (same namespace) these settings are for.
	// A pool has at most one PolicyProfile.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="poolRef is immutable; create a new PolicyProfile for another pool"
	PoolRef PoolReference `json:"poolRef"`

	// DefaultPolicyFamily is the family of requests whose class header names
	// no explicit class and no family.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	DefaultPolicyFamily string `json:"defaultPolicyFamily,omitempty"`

	// UncachedISLBuckets are the cache buckets, in increasing minTokens
	// order, starting at 0.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:XValidation:rule="self[0].minTokens == 0",message="the first bucket of uncachedISLBuckets must have minTokens 0"
	// +kubebuilder:validation:XValidation:rule="self.map(b, b.minTokens).isSorted() && self.all(b, self.exists_one(c, c.minTokens == b.minTokens))",message="uncachedISLBuckets minTokens must be strictly increasing"
	UncachedISLBuckets []CacheBucket `json:"uncachedISLBuckets,omitempty"`

	// DefaultPolicyClass is the class of requests without a usable class
	// header in a profile without families. Empty: the first class by
	// className.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.-]+$`
	DefaultPolicyClass string `json:"defaultPolicyClass,omitempty"`

	// Models are the pool-level settings of model profiles: requests for
	// exactly one of these model names use that profile (its settings here
	// and the PolicyClasses whose spec.model names it) instead of the root
	// profile.
	// +optional
	// +listType=map
	// +listMapKey=model
	// +kubebuilder:validation:MaxItems=64
	Models []ModelProfile `json:"models,omitempty"`

	// Identity says where a request's tenant identity comes from (SPEC
	// §14). Absent: no identity; the x-laneway-tenant header names the
	// tenant and every client hint is trusted as sent.
	// +optional
	Identity *Identity `json:"identity,omitempty"`

	// Tenants are the tenant bindings, in match order: the first binding
	// that matches a request's identity wins. They apply to every model
	// profile of the pool.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=10000
	Tenants []TenantBinding `json:"tenants,omitempty"`

	// DefaultTenant is what identities no binding matches may do; each
	// such identity is a tenant of its own. Absent: any class, weight 1,
	// and caps 0 when identity is configured.
	// +optional
	DefaultTenant *TenantRights `json:"defaultTenant,omitempty"`
}

// ModelProfile is the pool-level settings of one model profile; the fields
// mean what PolicyProfileSpec's fields of the same name mean.
//
// +kubebuilder:validation:XValidation:rule="has(self.defaultPolicyFamily) == has(self.uncachedISLBuckets)",message="defaultPolicyFamily and uncachedISLBuckets go together: set both when classes name a policy family, neither otherwise"
type ModelProfile struct {
	// Model is the exact model name of the requests this profile serves.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Model string `json:"model"`

	// DefaultPolicyFamily: see PolicyProfileSpec.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	DefaultPolicyFamily string `json:"defaultPolicyFamily,omitempty"`

	// UncachedISLBuckets: see PolicyProfileSpec.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:XValidation:rule="self[0].minTokens == 0",message="the first bucket of uncachedISLBuckets must have minTokens 0"
	// +kubebuilder:validation:XValidation:rule="self.map(b, b.minTokens).isSorted() && self.all(b, self.exists_one(c, c.minTokens == b.minTokens))",message="uncachedISLBuckets minTokens must be strictly increasing"
	UncachedISLBuckets []CacheBucket `json:"uncachedISLBuckets,omitempty"`

	// DefaultPolicyClass: see PolicyProfileSpec.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.-]+$`
	DefaultPolicyClass string `json:"defaultPolicyClass,omitempty"`
}

// PolicyProfileStatus is what the policy controller observed for the pool's
// policy as a whole.
type PolicyProfileStatus struct {
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

	// Identity says, in one line, where the policy in force reads a
	// request's tenant from ("none" without identity).
	// +optional
	Identity string `json:"identity,omitempty"`

	// TenantBindings is how many tenant bindings the policy in force has.
	// +optional
	TenantBindings int64 `json:"tenantBindings,omitempty"`
}

// PolicyProfile holds the settings of an InferencePool's policy that belong
// to no single class: default family, default class, cache buckets, the
// same for each model profile, and the tenant rules (identity source,
// bindings, default binding). One per pool.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=lwpp,categories=laneway
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.poolRef.name`
// +kubebuilder:printcolumn:name="Default Family",type=string,JSONPath=`.spec.defaultPolicyFamily`
// +kubebuilder:printcolumn:name="Default Class",type=string,JSONPath=`.spec.defaultPolicyClass`,priority=1
// +kubebuilder:printcolumn:name="Identity",type=string,JSONPath=`.status.identity`
// +kubebuilder:printcolumn:name="Tenants",type=integer,JSONPath=`.status.tenantBindings`
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type PolicyProfile struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the pool-level settings.
	// +required
	Spec PolicyProfileSpec `json:"spec"`
	// Status is written by the policy controller.
	// +optional
	Status PolicyProfileStatus `json:"status,omitempty"`
}

// PolicyProfileList is a list of PolicyProfile objects.
//
// +kubebuilder:object:root=true
type PolicyProfileList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the profiles.
	Items []PolicyProfile `json:"items"`
}
