// Package intel tests the picker's endpoint intelligence end to end: the
// real epp binary scraping real cmd/modelsim processes on 127.0.0.x
// addresses over HTTP, routing through the in-process local gateway
// (internal/testbed/gateway), with prefix caching, priority scheduling and metrics
// all real. It covers prefix affinity and the cached-token snapshot, the
// time to first token of the prefix-aware picker against least-loaded,
// stale metrics (a /metrics page that hangs), load sent to a model server
// behind the picker's back, and priority forwarding checked by the engine.
//
// The package holds only tests; this file exists so the package has a
// non-test file stating its job.
package intel
