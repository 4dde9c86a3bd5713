package v1alpha1

// Identity says where a request's tenant identity comes from (SPEC §14).
// The sources are tried in order: the metadata field, then the header. A
// request with neither is the anonymous tenant.
//
// +kubebuilder:validation:XValidation:rule="has(self.header) || has(self.metadata)",message="identity needs a source: set header, metadata, or both"
type Identity struct {
	// Header is a request header the gateway sets after authenticating the
	// caller, in lower case (for example x-tenant-id from a JWT claim). The
	// gateway must remove the copies clients send (docs/security.md).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[a-z0-9!#$%&'*+.^_|~-]+$`
	Header string `json:"header,omitempty"`

	// Metadata is a field of the ext_proc metadata_context the gateway
	// forwards, which a client cannot forge (for example the subject Envoy's
	// JWT filter writes).
	// +optional
	Metadata *IdentityMetadata `json:"metadata,omitempty"`

	// Anonymous is the tenant of a request that brings no identity.
	// Empty: "anonymous".
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Anonymous string `json:"anonymous,omitempty"`
}

// IdentityMetadata names one string field of the forwarded ext_proc
// metadata: a namespace and a key path into its struct.
type IdentityMetadata struct {
	// Namespace is the metadata namespace, such as
	// envoy.filters.http.jwt_authn.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Namespace string `json:"namespace"`

	// Path is the key path into the namespace's struct, such as
	// [my-provider, sub] for the subject of a JWT whose provider writes its
	// payload under my-provider (payload_in_metadata).
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	Path []string `json:"path"`
}

// TenantBinding names a tenant, selects the identities that are it, and
// gives them what TenantRights says. The first binding (in list order)
// that matches an identity wins. (The embedded TenantRights brings its own
// validation rule along.)
type TenantBinding struct {
	// Name is the tenant of every identity the binding matches: they share
	// one fair share and one set of queue limits. Unique in the list.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// Match selects identities.
	// +required
	Match TenantMatch `json:"match"`

	TenantRights `json:",inline"`
}

// TenantMatch selects the identities equal to one of Exact or starting with
// one of Prefix.
//
// +kubebuilder:validation:XValidation:rule="has(self.exact) || has(self.prefix)",message="match needs at least one exact value or prefix"
type TenantMatch struct {
	// Exact lists identities, compared byte for byte.
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=10000
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=1024
	Exact []string `json:"exact,omitempty"`

	// Prefix lists identity prefixes. An empty prefix would match every
	// identity: that is what PolicyProfile.spec.defaultTenant is for.
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=1000
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=1024
	Prefix []string `json:"prefix,omitempty"`
}

// TenantRights is what a tenant may do: the classes it may ask for, its
// weight in tenant-fair classes, caps on its priority hints and its own
// queue limits. PolicyProfile.spec.defaultTenant is one for identities no
// binding matches.
//
// +kubebuilder:validation:XValidation:rule="!has(self.allowed) || size(self.allowed) == 1 || has(self.defaultFamily)",message="allowed has more than one entry, so defaultFamily is required (where requests that ask for another class go)"
type TenantRights struct {
	// Allowed lists the policy families and explicit class names the tenant
	// may ask for; a class header naming anything else is ignored. Absent:
	// any class.
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	Allowed []string `json:"allowed,omitempty"`

	// DefaultFamily is where the tenant's requests go when they ask for no
	// class or for one not allowed: a family or an explicit class name, in
	// allowed when that is set.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	DefaultFamily string `json:"defaultFamily,omitempty"`

	// Weight is the tenant's DRR weight inside tenant-fair classes: its
	// quantum there is the class quantum times this. Absent: 1.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	Weight *int64 `json:"weight,omitempty"`

	// MaxPriority caps the soft priority hint (higher hints are clamped,
	// not refused). Absent: 0 when identity is configured, no cap without.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	MaxPriority *int64 `json:"maxPriority,omitempty"`

	// MaxStrictPriority caps the strict priority hint, as MaxPriority does.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4294967295
	MaxStrictPriority *int64 `json:"maxStrictPriority,omitempty"`

	// RequestQueueLimit bounds the tenant's queued requests in each class
	// (429 beyond it). Absent: no bound of its own.
	// +optional
	// +kubebuilder:validation:Minimum=1
	RequestQueueLimit *int64 `json:"requestQueueLimit,omitempty"`

	// RawISLTokenQueueLimit bounds the tenant's queued prompt tokens in
	// each class (429 beyond it). Absent: no bound of its own.
	// +optional
	// +kubebuilder:validation:Minimum=1
	RawISLTokenQueueLimit *int64 `json:"rawISLTokenQueueLimit,omitempty"`
}
