// Package controller is the Kubernetes side of the endpoint picker: it
// watches one InferencePool, the pods it selects, and the pool's
// PolicyClass and PolicyProfile objects, and hands snapshots to the
// dispatcher (SetEndpoints, SetPolicy). Nothing on the request path calls
// the API server.
//
// Three pieces run in a controller-runtime manager whose cache is scoped to
// the pool's namespace:
//
//   - the endpoint controller turns the pool and its pods into the full
//     endpoint set (each ready pod × active target port) and pushes it when
//     it changed; every event maps to one work-queue key, so a burst of pod
//     events coalesces into one resync;
//   - the policy controller validates the pool's policy objects together
//     (pkg/policy), applies a valid set and keeps the last valid one in
//     force otherwise;
//   - the status writer, on the elected leader only (the caller runs it:
//     Controllers.StatusWriter), writes each object's Accepted condition
//     and each class's pending count, only when they change and at most
//     once per interval for the counts.
//
// The two controllers run on every replica (not only the leader), so a
// follower's dispatcher already holds the endpoints and the policy when it
// takes over or schedules on its own, and keeps them while the API server
// is unreachable. Controllers.PolicyApplied and Config.PolicyAccepted tell
// the picker whether a valid policy was ever applied and whether the
// objects are accepted now (readiness policy_invalid, the
// laneway_policy_accepted gauge).
//
// The +kubebuilder:rbac markers in rbac.go are the picker's whole API
// access; `make manifests` generates config/rbac/role.yaml from them.
package controller
