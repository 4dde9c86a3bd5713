// Package e2e holds Laneway's end-to-end suites: the Helm chart checked
// against a real kube-apiserver, and one set of scenarios (routing, the
// SPEC §11 weighted share through PolicyClass objects, strict priority,
// queue limits, pod deletion, policy change and picker restart under load)
// run in one of two environments, chosen by E2E_ENV:
//
//   - local (the default, part of `make test`): a real kube-apiserver and
//     etcd (envtest), the chart rendered by helm and applied to it, the
//     real epp binary running outside the cluster with the chart's
//     ServiceAccount token (so the chart's Role is what it gets), modelsim
//     processes on 127.0.0.x standing in for the pool's pods, and the local
//     ext_proc gateway (internal/testbed/gateway) in place of Envoy;
//   - kind (`make test-e2e-kind`): a kind cluster, the epp and modelsim
//     images built from build/*.Dockerfile and loaded into it, the chart
//     installed with its Envoy data plane, and the scenarios sent through a
//     port-forward to Envoy. It skips, naming what is missing, without
//     docker, kind or a Docker engine.
//
// The scenarios only talk to an environment through the cluster interface
// (install a release, run pods, restart the picker, reach the gateway), so
// both environments judge the same behaviour the same way. docs/testing.md
// describes how to run them.
package e2e
