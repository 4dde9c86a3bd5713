// Package drr is Laneway's queue: policy classes served by Deficit Round
// Robin (SPEC §3–§5). It admits requests against per-class limits, orders
// each class's lanes (fcfs, wspt or edf under strict tiers and deadlines),
// and picks the next request to leave: an expired one, an unroutable head,
// or the winner of one DRR arbitration.
//
// The package is pure: no I/O, no clock reads, no goroutines. Time and
// endpoint state come in as arguments (Pop's now and Probe), which keeps it
// deterministic, fuzzable and honest to benchmark. One goroutine owns a
// Scheduler.
//
// Invariants: every queued item leaves exactly once (Pop, Remove); an empty
// class holds no deficit; a class without a dispatchable head earns no
// credit; credit arithmetic saturates instead of wrapping; the pending sums
// are exact. Per class there is a shared heap and one exact lane per pinned
// endpoint; the lanes that are not known to be blocked sit in an index
// ordered by their heads, and a blocked lane is parked on its endpoint until
// EndpointChanged, so each lane is probed once per endpoint change.
//
// Complexity: Offer and Remove O(log n); Pop O(C + L log L) for C classes
// and L lanes probed, independent of request cost and quantum (oversized
// heads get bulk virtual rounds rather than one scan per round).
package drr
