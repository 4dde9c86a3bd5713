// Package dispatcher is the live driver of the scheduling core
// (pkg/sched): one goroutine, the loop, owns a sched.Core and feeds it the
// wall clock, the gRPC streams' requests and their response-path events.
//
// Callers talk to the loop over a channel: Acquire offers a request and
// waits for a Grant (or an error that becomes an HTTP answer); endpoint
// sets, scrapes and policy swaps arrive as functions run on the loop. A
// Grant reports its response-path events (FirstByte, Done) through a
// mailbox instead, without waiting for the loop: the loop applies the
// mailbox before every command, so admissions and snapshots see current
// accounting, and an event wakes the loop only while requests are queued,
// so a request to an idle endpoint costs one round trip to the loop, not
// three. Every loop turn ends by draining the core and answering what it
// decided, then arming a timer for the next wait-budget expiry. There is
// no goroutine per queued request: a waiting caller blocks on a buffered
// channel and its own context.
//
// Offer is Acquire without a waiting caller: the answer goes to a
// function the loop calls, so the leader's side of the replica link
// (internal/ha) feeds its followers' tickets into the same queue without
// a goroutine per ticket, and Cancel withdraws one.
//
// Every Acquire gets exactly one result, and every Offer one answer. A caller whose context ends while
// queued is removed at once; if the loop had already granted it, the grant
// is released so the endpoint's accounting does not leak.
package dispatcher
