// Package autothreshold is the controller behind `prefill_busy_threshold:
// auto` (SPEC §5): per endpoint, it keeps the busy test's threshold at the
// lowest in-prefill token level at which the engine is never starved of
// prompts, from the engine's own counters, and moves it when the engine,
// the prompt mix or the load change.
//
// It is pure and synchronous, like the core that owns it (pkg/sched): no
// goroutine, no clock; every observation carries its time. One Controller
// per endpoint, fed at each fresh scrape; the cost is O(1) per scrape and
// a few words of state.
//
// # The signals
//
// Two things can be wrong with a threshold. Too high, and prompts wait
// inside the engine, in its order rather than the picker's: an engine
// that is short of slots or KV cache shows them in its own waiting queue
// (vLLM's and SGLang's num_requests_waiting), and every prompt tokens
// beyond one step's budget lengthens every step, so the time to first
// token grows with no gain in throughput. Too low, and the engine is
// starved: it shows an empty waiting queue while the picker holds
// requests, and at the extreme holds no request at all. Both judgements
// read a whole decision window (at least Window long and MinScrapes
// scrapes), so one scrape that lands between two engine steps decides
// nothing.
//
// The throughput a step budget buys is the third input. A step costs a
// fixed time (the decodes it carries) plus a time per prompt token, so
// the prefill rate at T tokens per step is T/(T/P + c): it approaches the
// full rate slowly, and the last eighth of the budget adds about 1% of
// throughput (on the default engine: 0.2%) while making every step, and
// the time to first token, an eighth longer. The counters cannot resolve
// a 1% difference in rate within seconds (an 8192-token step lasts about
// 0.4 s, a scrape comes every 0.1 s), so the controller does not search
// for that knee; it starts there, at 7/8 of the step budget.
//
// # The rule
//
// With B the endpoint's max_num_batched_tokens (the step budget), S = 7/8
// B the start, p the mean prompt the picker dispatches, and band =
// max(B/4, 4p) tokens (the waiting queue the engine may keep: what it
// takes at a step boundary without starving, at most a quarter of a
// step):
//
//   - start at T = S;
//   - lower, when the engine's waiting queue held more than band tokens
//     (requests × p) at every scrape of the window: to the tokens the
//     engine was prefilling (the picker's in-prefill load less its waiting
//     queue) plus one prompt, and never above T − p;
//   - lower to one prompt, when the engine's KV cache was full (usage at
//     least KVFull) and its waiting queue held a request at every scrape
//     of the window: a cache-bound engine admits only as finished
//     requests free their cache, in its own order, so a prompt waiting
//     in it gains nothing over waiting in the picker; to p, and never
//     above T − p;
//   - lower to the decode-bound level D, when T is more than one prompt
//     above it: with K the engine's cache in tokens and O the expected
//     output, a full engine holds N = K/(p+O) requests, finishes N/O per
//     step and takes in x = p·N/O prompt tokens a step; when x < S the
//     cache, not the step budget, bounds the engine, and D = max(x − p,
//     B/16) (the busy test lets one prompt past T). O is what the
//     requests asked for (Sample.AskedOutput), or the engine's own mean
//     output per finished request when that is less (Controller.Output:
//     a max_tokens is a bound, often far above the output); no level
//     without K, an asked output and the engine's output counters;
//   - raise, when the picker held requests at every scrape of the window
//     (the endpoint was busy for them) while the engine's waiting queue
//     was empty at every one, by min(max(T/8, p), band/2): up to S (to D
//     while the decode-bound level applies) if the
//     engine also had free sequences and cache at every scrape (fewer
//     running than 15/16 of the most it ran while requests waited, KV
//     usage below KVFull; an engine whose sequences or cache are all
//     taken is bound by its decodes, and more prompts would only wait in
//     it), or up to the ceiling when the engine held no
//     request at all at every scrape (idle). An engine that admits every
//     request it is sent into its running batch (chunked prefill with free
//     slots) never shows a waiting queue, so an empty one alone cannot
//     justify going past S;
//   - hold otherwise (the deadband: a waiting queue of at least one
//     request and at most band tokens, an engine that takes all it is
//     given at T = S, or a window with mixed evidence).
//
// T stays within [max(B/16, 1), 4B]. Without a known step budget the
// controller starts at policy.UnknownMaxBatchedTokens (an unknown engine
// is never made busy by accident) and only lowers. An engine restart (its
// prompt-token counter went back) or a new step budget starts over.
//
// # Why it settles and does not oscillate
//
// For a steady engine and load the waiting queue at a scrape grows with T
// (tokens the engine cannot take wait): W(T) ≈ max(0, T − C) for the
// engine's intake C. A raise happens only at W = 0 and moves T by at most
// band/2, so it lands with W ≤ band/2, inside the deadband: a raise never
// causes a lower. A lower happens only at W > band and lands at C + p,
// where W ≈ one request > 0, inside the deadband: a lower never causes a
// raise. A lower to one prompt needs the cache full at every scrape of a
// window, a raise the cache below KVFull at every scrape of one; an
// engine bound by its cache frees it only as its load falls, so that
// reversal also needs a change of the load. So after a change of the engine or the load the threshold
// makes at most one reversal and then holds, one window per move (the
// decode-bound level adds one move to it, and raises stop at it); a
// lower reaches the band in one move, and raises are multiplicative (from
// B/16 back to S in at most 24 windows, 12 s; from a lowered level that
// kept the engine busy, far fewer). Safety holds whatever the engine
// does: the threshold never rises while the engine's queue is over the
// band or its cache is full, never falls while the engine shows no waiting request and the
// picker holds some, except to the decode-bound level, where the engine
// is still offered what its decodes free per step (so the engine is not starved for longer than a
// window plus a scrape at any level below S, nor while idle at any
// level), and never leaves its bounds. Stale metrics make an endpoint
// busy whatever its threshold (SPEC §9); the controller only reads fresh
// ones.
package autothreshold
