// Package testenv starts a real kube-apiserver and etcd (controller-runtime's
// envtest) with Laneway's CRDs and the upstream InferencePool CRD installed,
// for tests that need admission, CEL validation or a controller against a
// real API server. The binaries come from `make envtest` (bin/k8s);
// KUBEBUILDER_ASSETS overrides where they are looked for.
package testenv
