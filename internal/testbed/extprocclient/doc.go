// Package extprocclient plays the gateway's side of the Envoy ext_proc
// protocol against an endpoint picker: it processes one HTTP request the way
// Envoy's ext_proc filter does in FULL_DUPLEX_STREAMED mode (or BUFFERED mode
// on request), so the picker can be driven without Envoy.
//
// One Exchange is one ext_proc stream, i.e. one HTTP request:
//
//	ex, err := client.Start(ctx, extprocclient.RequestSpec{Path: "/v1/completions", Body: body})
//	d := ex.Decision()            // pick (header and metadata) or ImmediateResponse
//	... contact d.Endpoints[0] with d.Body ...
//	mut, err := ex.SendResponseHeaders(200, respHeader, false, served)
//	out, err := ex.SendResponseBody(chunk, false) // echoed chunk, forward it
//	out, err = ex.SendResponseBody(nil, true)
//	ex.Close()
//
// Start sends the request headers (HTTP/2 pseudo headers first, as Envoy
// does), the protocol_config Envoy puts in a stream's first message, the
// optional subset hint as filter metadata, and the body, then waits for the
// answer. Decision.Latency is SPEC §13's decision latency: from sending the
// last request message to receiving the request-headers answer.
//
// Not every gateway plays the response phases. Options.Shape selects a
// header-only gateway instead: Envoy with response_header_mode SKIP and
// response_body_mode NONE (EnvoySkip), or NGINX Gateway Fabric's
// endpoint-picker shim (NginxShim, with NewPerRequest for its connection
// per request). Their Start half-closes the stream after the request and
// returns once the picker has ended it; Exchange.Ended is then true and
// no response phase can be sent. Suites use them to show what a picker
// does when it never hears of the response.
//
// The command-line gateway (cmd/gateway), integration tests and the load tool
// all drive the picker through this package.
package extprocclient
