// Package workload is the weighted-share regression workload of SPEC §11:
// two policy classes flood one model server with equal-cost requests and
// the order of completions shows each class's share of service.
//
// It drives any OpenAI-compatible HTTP front (the local gateway in the demo
// and the end-to-end suites, Envoy in a kind cluster) and computes the
// figures the reference regression asserts on, so the demo, the local e2e
// suite and the kind suite judge runs the same way.
package workload
