// Package extproc is Laneway's side of the Envoy external processing (ext_proc)
// protocol: one gRPC stream of
// envoy.service.ext_proc.v3.ExternalProcessor/Process per HTTP request.
//
// The package owns the protocol state machine and nothing else. It turns the
// request phases into a Request, asks a Decider where the request goes (the
// Decider may hold the stream while the request waits in a queue), and answers
// the gateway exactly once: either with the request-headers response carrying
// the pick (header x-gateway-destination-endpoint plus the same value in
// dynamic metadata envoy.lb, with clear_route_cache) or with an
// ImmediateResponse (400, 429, 503). On the response path it passes headers and
// body chunks through unchanged, chunk by chunk, and reports the first body byte
// and the end of the exchange to the Decision's Lifecycle so the scheduler can
// account for prefill and completion.
//
// Supported body modes are FULL_DUPLEX_STREAMED (what the Gateway API Inference
// Extension protocol prescribes) and BUFFERED; NONE works for requests whose
// bodies are not sent. The mode is read from the protocol_config Envoy puts in
// the first message of a stream; a stream without one is taken to be
// FULL_DUPLEX_STREAMED.
package extproc
