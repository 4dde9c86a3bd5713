// Package h2client is an event-driven gateway for load runs: it plays the
// Envoy side of many ext_proc streams over a few HTTP/2 connections, the
// way Envoy's worker threads do, instead of spending a goroutine, a gRPC
// client stream and its bookkeeping on every request.
//
// Why it exists: on a small machine the load tool shares the CPU with the
// picker it measures. The gRPC-client load tool (internal/testbed/extprocclient, one
// goroutine per stream) spent more CPU per request than the picker itself,
// and its garbage-collection cycles stalled its own arrivals by 15 ms at a
// time, so the tail it reported was largely its own. Envoy is an event loop
// written in C++; a load tool standing in for it should be cheap too.
//
// Per connection there is one reader goroutine (frames in, the protocol
// state of every stream), one writer goroutine (every frame queued since its
// last write goes out in one write call) and one hold goroutine (a FIFO of
// routed streams waiting out the fixed hold time). A request's messages are
// encoded once per run (Plan) and shared by every stream. Flow control,
// SETTINGS, PING, GOAWAY and RST_STREAM are handled as RFC 9113 requires, so
// the client works against any gRPC server, not only Laneway's.
//
// A Plan with Exchange.HeaderOnly plays a gateway that sends no response
// phase (Envoy with response_header_mode SKIP and response_body_mode
// NONE): END_STREAM goes with the request, and the stream is over when the
// picker ends it after its answer, whatever the hold.
//
// Decision latency is measured as SPEC §13 defines it: from just before the
// write call that carries a stream's last request message to the moment the
// reader has the request-headers answer (or the immediate response) in
// hand.
package h2client
