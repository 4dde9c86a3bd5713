package controller

// The picker's API access, all namespaced (the pool's namespace): the Role
// in config/rbac is generated from these markers by `make manifests`, and a
// test fails when the committed Role differs from them. The namespace
// argument makes controller-gen emit a Role rather than a ClusterRole;
// "default" is a placeholder that a kustomize overlay (or the chart)
// replaces with the pool's namespace.
//
// Leases are for leader election (client-go's lease lock only gets,
// creates and updates): the picker may create a Lease (RBAC cannot name
// the object of a create), and get and update only its pool's,
// laneway-epp-<pool> (ha.LeaseName); "laneway-epp-pool" is a placeholder
// as the namespace is, for a pool named "pool", which an overlay (or the
// chart, from the pool's name) replaces. Events are the election's
// "became leader" records and are best effort.
//
// +kubebuilder:rbac:groups="",namespace=default,resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups=inference.networking.k8s.io,namespace=default,resources=inferencepools,verbs=get;list;watch
// +kubebuilder:rbac:groups=laneway.dev,namespace=default,resources=policyclasses;policyprofiles,verbs=get;list;watch
// +kubebuilder:rbac:groups=laneway.dev,namespace=default,resources=policyclasses/status;policyprofiles/status,verbs=update;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=default,resources=leases,verbs=create
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=default,resources=leases,verbs=get;update,resourceNames=laneway-epp-pool
// +kubebuilder:rbac:groups="",namespace=default,resources=events,verbs=create;patch
