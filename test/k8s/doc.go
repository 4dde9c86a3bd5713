// Package k8s is the Kubernetes-mode suite: a real kube-apiserver and etcd
// (envtest, `make envtest`) with Laneway's CRDs and the InferencePool CRD,
// and the real epp binary running against it with --pool-name, through a
// kubeconfig authenticated as the laneway-epp ServiceAccount and bound by
// the committed config/rbac manifests, so a permission missing there fails
// a test. The tests create pods with their status (127.0.0.x addresses
// where real HTTP servers listen), InferencePools and policy objects, play
// Envoy's side of ext_proc with internal/testbed/extprocclient, and measure how fast
// the picker follows: endpoint changes, a pinned request on a deleted pod,
// policy swaps under a full queue, and leader failover.
//
// Without the envtest binaries every test skips with one line.
//
// The package holds only tests; this file exists so the package has a
// non-test file stating its job.
package k8s
