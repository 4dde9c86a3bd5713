// Package epp wires the endpoint picker together: options and flags, the
// ext_proc Decider that turns a gateway request into a dispatcher ticket,
// the gRPC, health and metrics servers (TLS, mutual TLS, the scrape bound),
// policy-file and endpoints-file reloads and the SIGTERM drain. cmd/epp is a thin main around Run (standalone mode) and
// RunKube (Kubernetes mode, --pool-name: internal/controller feeds the
// dispatcher, and readiness follows cache sync and leader election).
package epp
