// Package sched is Laneway's scheduling core: everything the picker decides
// about a request between the parsed body and the endpoint it is sent to
// (SPEC §1–§5), as one synchronous, deterministic state machine over the
// DRR queue of pkg/drr. The live dispatcher loop (wall clock, gRPC
// streams), the simulator (virtual clock, simulated engines) and the fuzz
// target (random operations) all drive this same Core.
//
// A Core owns the endpoint registry (ids, address maps, id reuse), the
// eligibility rules (subset hint or allow-list, pins, taints, the overload
// filter), the busy test, admission against the queue limits, the pick and
// its charge, release accounting (first response byte, end of stream), the
// metrics-driven estimate of load this replica did not send, the
// prefix-cache index and live policy swaps. It has no goroutines, channels
// or clock reads: every call that needs the time takes now (nanoseconds on
// the caller's clock), and one goroutine owns a Core. The only
// concurrency-safe parts are a Grant's FirstByte and Done, which hand the
// event to the Releaser (the driver's mailbox) for the owner to apply with
// Release.
//
// Calls change state and may decide requests (a direct grant at Admit, a
// 503 for the pinned requests of a removed endpoint); Drain then dispatches
// whatever can leave the queue and returns every decision since the last
// Drain, in order, as Leaves. A driver calls Drain after each call that can
// change what is dispatchable, and arms a timer for NextDeadline.
//
// Invariants: every admitted Request leaves exactly once (one Leave:
// granted, rejected, shed, unroutable, cancelled or shut down); a granted
// request was eligible at the grant (inside its allow-list, on a live
// endpoint, not tainted unless pinned, not past the overload filter) and,
// when its class queues, its endpoint was not busy for that class;
// an allow-list holds endpoints, not ids, so an id reused by a new endpoint
// never widens it; an endpoint's active prefill and in-flight counts are
// exactly the sums over its unreleased grants, so they return to zero when
// everything is released; a removed endpoint's pinned requests are answered
// 503 before its id is reused.
//
// Roles (roles.go): in a pool with prefill-only endpoints, the admission
// decides per request whether it disaggregates (its snapshot taken over
// the prefill endpoints, its class's threshold) and each walk for it is
// split by stage: the busy test, the queue and the pick read the prefill
// endpoints of a disaggregating request, and its grant adds the decode
// endpoint with the least decode load as the destination. Its prefill
// endpoint holds the prefill charge and the in-flight count until the
// first byte, its decode endpoint the in-flight count until the end, so
// the accounting invariant above holds per endpoint; a stream that ends
// before its first byte leaves the charge in the prefill endpoint's engine
// ledger (ledger.go). A pool without prefill-only endpoints never splits,
// and its grants carry no disaggregation or adapter state (one nil
// pointer). A request that queued before the pool had prefill-only
// endpoints is served whole by the decode stage. LoRA affinity (lora.go)
// gives an adapter request's candidates a tier the choosers rank before
// load.
//
// Admission is one pass: a single walk over the request's endpoints
// builds its candidate set (eligibility and prefix overlap, and which
// filter dropped the others), the class is resolved once from the cost
// snapshot that set gives, and the busy test, the verdict, a direct
// grant's pick and a 503's filter all read that same set. It is the
// package's only eligibility walk; a queued head's probe and a grant at
// Drain run it afresh, as the endpoints change while a request waits.
//
// Complexity, for E live endpoints (|allow| with a subset hint), C
// classes and L exact lanes rechecked: Admit O(E + log n): one walk, with
// one prefix-index lookup per eligible endpoint, then a loop over the
// candidates for the busy test and, for a direct grant, one for the pick;
// one dispatch O(C + L log L) in pkg/drr plus O(E) for a shared head's
// probe and O(E) for the grant's walk and pick; Release O(1);
// SetEndpoints O(E log E); SetPolicy O(n log n) for n queued requests.
// The walk's and the pick's buffers live on the Core and are reused from
// one decision to the next.
package sched
