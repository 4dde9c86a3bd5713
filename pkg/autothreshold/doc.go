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
// # The signal
//
// An engine runs at full prefill throughput when its next step always
// finds more prompt tokens than it can take: then, at a scrape, some
// requests are left in its own waiting queue (vLLM's and SGLang's
// num_requests_waiting). With the picker holding requests and the engine
// showing an empty waiting queue at every scrape, the threshold starves
// the engine; with a waiting queue longer than the band below at every
// scrape, requests wait inside the engine, in its order rather than the
// picker's, and the threshold is too high. Both judgements read the whole
// of a decision window (at least Window long and MinScrapes scrapes), so
// one scrape that lands between two engine steps decides nothing.
//
// # The rule
//
// With B the endpoint's max_num_batched_tokens (the step budget), p the
// mean prompt the picker dispatches, and band = max(B/4, 2p) tokens (the
// waiting queue the engine may keep: what it takes at a step boundary
// without starving, at most a quarter of a step):
//
//   - start at T = B, the most one step can take;
//   - lower, when the engine's waiting queue held more than band tokens
//     (requests × p) at every scrape of the window: to the tokens the
//     engine was prefilling (the picker's in-prefill load less its waiting
//     queue) plus band/2, and never above T − p;
//   - raise, when the picker held requests at every scrape of the window
//     (the endpoint was busy for them) while the engine's waiting queue
//     was empty at every one: by min(max(T/8, p), band/2);
//   - hold otherwise (the deadband: a waiting queue of at least one
//     request and at most band tokens, or a window with mixed evidence).
//
// T stays within [max(B/16, 1), 4B]. Without a known step budget the
// controller starts at policy.UnknownMaxBatchedTokens (an unknown engine
// is never made busy by accident) and only lowers. An engine restart (its
// prompt-token counter went back) or a new step budget starts over.
//
// # Why it settles and does not oscillate
//
// For a steady engine and load the waiting queue at a scrape grows with T
// (tokens the engine cannot take in its step wait): W(T) ≈ max(0, T − C)
// for the engine's intake C. A raise happens only at W = 0 and moves T by
// at most band/2, so it lands with W ≤ band/2, inside the deadband: a
// raise never causes a lower. A lower happens only at W > band and lands
// at C + band/2, where W ≈ band/2 > 0, inside the deadband: a lower never
// causes a raise. So after a change of the engine or the load the
// threshold makes at most one reversal and then holds: it converges in
// at most one window per move, and each move is a multiplicative (up) or
// proportional (down) step, so the number of windows is logarithmic in
// the distance to travel (from B to 4B: 12 raises; a lower reaches the
// band in one). Safety holds whatever the engine does: the threshold
// never rises while the engine's queue is over the band, never falls
// while the engine shows no waiting request and the picker holds some
// (so the engine is not starved for longer than a window plus a scrape),
// and never leaves its bounds. Stale metrics make an endpoint busy
// whatever its threshold (SPEC §9); the controller only reads fresh ones.
package autothreshold
