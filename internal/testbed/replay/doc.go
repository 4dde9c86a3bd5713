// Package replay sends a trace through real processes: open loop, each
// request at its arrival time whether or not earlier ones have finished,
// through the local gateway (cmd/gateway) to the picker (cmd/epp) and
// cmd/modelsim servers. What each request saw comes back as a
// simulate.Result, so laneway simulate's summary, requests.jsonl and
// figures describe the real run exactly as they describe a simulated one,
// and the two compare line for line. cmd/loadgen --trace and the two-way
// scenarios of `make bench-quality` are its callers.
//
// A request goes out as a streaming /v1/completions call with a token-id
// prompt (simulate.Trace.AppendPrompt: blocks equal exactly where the
// simulator's are, so modelsim's prefix cache sees the trace's reuse), its
// output length as max_tokens, and its class, tenant and priority hints
// as the picker's headers. Its outcome is read from the client side:
// dispatch when the response headers arrive (modelsim sends them as it
// accepts the request), the first token at the first data event, the end
// at [DONE], the server from the gateway's x-laneway-endpoint header, and
// the engine's prefix-cache hit from usage.prompt_tokens_details. What the
// client cannot see stays unknown: engine admission (Start -1), whether
// the picker queued the request (Queued false), and the picker's own
// cached-token estimate (Cached is the engine's hit).
//
// StartFleet starts the processes a replay needs (internal/testbed/launch)
// with the engine flags of a simulate.Fleet, so a simulation of the same
// fleet models them.
//
// Cost: one goroutine and one HTTP connection per request in flight; the
// prompt of a request is built just before it is sent and dropped once
// sent, so memory is O(requests) for the outcomes plus the bodies in
// flight.
package replay
