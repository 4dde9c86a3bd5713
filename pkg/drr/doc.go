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
// Tenants (SPEC §14): every class counts the tenants it holds requests of,
// for per-tenant limits and a bound on active tenants. A class with
// TenantFairness splits its shared heap into one sub-queue per tenant and
// spends its DRR credit on the tenant a second DRR picks: quantum = class
// quantum × tenant weight, cost = scheduling cost, with the ring's deficit,
// bulk-round and cursor rules, in the order a literal round-robin would
// serve (FuzzTenantDRR checks it against one). A tenant with nothing queued
// holds no state. tenant.go explains how the tenant ring is kept as a heap.
//
// Heaps: the lanes, the candidate indexes and the tenant rings are
// pkg/iheap heaps (generic, so nothing is boxed and Pop does not allocate;
// intrusive, so Remove and a changed head cost O(log n) through the
// position each item, lane and tenant keeps). Each entry carries a 64-bit
// prefix of its order (hotKey, the head's hotKey, tenKey), compared
// without touching the items; the full order breaks equal prefixes.
// TestHeapConformance runs iheap's conformance suite against all three.
//
// Complexity: Offer and Remove O(log n); Pop O(C + L log L + log T) for C
// classes, L lanes probed and T backlogged tenants of the dispatching
// class, independent of request cost and quantum (oversized heads get bulk
// virtual rounds rather than one scan per round). An active tenant costs
// about 245 bytes beyond its requests (BenchmarkMemoryPerTenant).
package drr
