// Package gateway is a small HTTP reverse proxy that consults an endpoint
// picker over ext_proc the way Envoy does, so Laneway can run on one machine
// without Envoy (demos, end-to-end tests, development).
//
// Per HTTP request it opens one ext_proc stream (FULL_DUPLEX_STREAMED, via
// internal/testbed/extprocclient), applies an ImmediateResponse as the client's
// answer, or forwards the (possibly replaced) body to the endpoint in
// x-gateway-destination-endpoint, falling back down that list when a
// connection cannot be made, and streams the response back through the
// picker chunk by chunk with a flush after each, so server-sent events reach
// the client as they are produced. The response names the serving endpoint
// in x-laneway-endpoint.
//
// Given several pickers (the replicas of one pool, --epp a,b,c) it asks
// them in turn, as a Service spreads a gateway's streams. A picker that
// fails before deciding (its connection refused or broken) is replaced by
// the next for that request, nothing having gone upstream yet; one that
// fails after deciding has its response finished without it, as Envoy's
// ext_proc filter continues a stream whose processor failed when
// failure_mode_allow is set. Either way the client gets one answer.
//
// It is a stand-in, not a production data plane: production uses Envoy or
// another ext_proc gateway (see cmd/gateway/README.md).
package gateway
