// Package dispatcher owns the request path's mutable state: the DRR
// scheduler of pkg/drr and the per-endpoint accounting (active prefill
// tokens, in-flight requests) that its busy test reads.
//
// One goroutine, the loop, owns all of it. Callers talk to the loop over a
// channel: Acquire offers a request and waits for a Grant (or an error that
// becomes an HTTP answer); endpoint and policy changes arrive as
// snapshots. A Grant reports its response-path events (FirstByte, Done)
// through a mailbox instead, without waiting for the loop: the loop applies
// the mailbox before every command, so admissions and snapshots see current
// accounting, and an event wakes the loop only while requests are queued,
// so a request to an idle endpoint costs one round trip to the loop, not
// three. After every event that can make a head dispatchable the loop
// drains: it pops from the scheduler until nothing more can leave. There is
// no goroutine per queued request: a waiting caller blocks on a buffered
// channel and its own context.
//
// The loop also owns the endpoint intelligence: scraped metrics arrive
// through SetEndpointMetrics (an endpoint with stale or not yet scraped
// metrics is busy and ranked last; waiting requests in its engine beyond
// what this picker has in flight there count as unseen prefill load), and
// the prefix-cache index of pkg/picker sets a ticket's cached tokens at
// admission and learns every pick.
//
// Every Acquire gets exactly one result. A caller whose context ends while
// queued is removed at once; if the loop had already granted it, the grant
// is released so the endpoint's accounting does not leak.
package dispatcher
