// Package affinity holds the two pieces of endpoint choice that need no
// knowledge of the dispatcher: an approximate prefix-cache index (which
// prompt prefixes this picker sent to which endpoint) and the cost ranking
// of candidate endpoints.
//
// # Prefix index
//
// Index remembers, per endpoint, the chained block hashes of the prompts
// routed there (pkg/tokenize's BlockHashes, the same hashes the engines'
// automatic prefix caching keys on), so the overlap of a new prompt with
// what an endpoint probably has cached is a few map lookups. It is fed only
// by this picker's own routing decisions; it cannot see evictions inside
// the engine, so it ages entries out by the endpoint's cache capacity and by
// time.
//
// It stays cheap for long prompts by keeping a sparse set of positions:
// every block of the first 64, then every second block up to 128, every
// fourth up to 256, and so on (32 positions per doubling), plus the last
// block of each recorded prompt. A 32k-token prompt in 16-token blocks
// stores 225 of its 2048 hashes, and an overlap is found by binary search
// over those positions, so it is exact for a repeated prompt and within
// 1/32 of the truth for a shared prefix. The binary search relies on each
// endpoint's entry set being prefix-closed, which the eviction order keeps:
// a prompt's blocks are queued for eviction tail first, and every prompt
// that refreshes a block refreshes all blocks before it.
//
// # Cost
//
// Ranker orders candidates by tier (fresh and not busy, then busy, then
// stale metrics), then by cost in blocks — the request's blocks left to
// prefill on that endpoint after its cached overlap, plus the endpoint's
// active prefill, plus one block per sequence running there — and breaks
// ties at random so equal
// endpoints share new prefixes instead of the first one collecting them
// all. Only the best few positions are sorted: a pick over 1,000 endpoints
// with two fallbacks is a linear scan, not a sort.
package affinity
