// Package epp wires the endpoint picker together: options and flags, the
// ext_proc Decider that turns a gateway request into a dispatcher ticket
// (handler.go, request.go), the endpoint intelligence around the
// dispatcher (intel.go: scraper, prefix index, routed-token series,
// priority forwarding), the gRPC, health and metrics servers (TLS, mutual
// TLS, the scrape bound), policy-file and endpoints-file reloads and the
// SIGTERM shutdown (delay, then drain). cmd/epp is a thin main around Run
// (standalone mode) and RunKube (Kubernetes mode, --pool-name:
// internal/controller feeds the dispatcher, readiness follows cache sync
// and a valid policy, and with leader election internal/ha elects one
// leader on the pool's Lease, to which the followers send a ticket per
// request over the replica link, its own port: Server.useReplicaLink).
package epp
