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
//
// In FULL_DUPLEX_STREAMED mode the body is buffered to its end, the Decider
// runs, the request-headers response carries the pick, and the body (or its
// replacement) is streamed back in chunks of at most MaxChunkBytes. In
// BUFFERED mode Envoy sends the body only after the request headers are
// answered, so the headers get an empty answer and the pick rides on the body
// response (with the body mutation, if any); the decision is still made once.
//
// The request bytes held by the streams are bounded together
// (Options.MaxHeldBodyBytes): the header block of every open stream, and
// the body buffer of every stream not yet answered, counted as the bytes
// arrive, never from what content-length announces; a request that would
// pass the budget is answered 429 held_bytes, and a body is let go as soon
// as it has been passed back to the gateway. A header block over
// Options.MaxHeaderBytes is answered 431 and not kept; a body that has not
// arrived within Options.BodyTimeout of its headers is answered 408 and
// let go (a timer per body, recycled; its callback and the stream's
// goroutine share one mutex for the body phase only); past
// Options.MaxStreams open streams a new one is answered 429 stream_limit.
package extproc
