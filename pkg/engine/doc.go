// Package engine is the timing model of one vLLM-like model server,
// driven by a clock it is given: cmd/modelsim runs it on the wall clock
// behind its HTTP server, `laneway simulate` in virtual time, and both get
// the same timeline from the same code.
//
// # Model
//
// The engine runs steps, as vLLM's engine core does. Before each step it
// moves waiting requests into free slots (at most MaxNumSeqs running), in
// arrival order, or by the request's priority (lower first, ties by
// arrival) under the priority policy. A request is admitted only if the KV
// cache can hold its prompt plus every output token; blocks are reserved
// for the whole request at admission, so there is no preemption. A request
// whose adapter cannot run now (MaxLoRAs distinct adapters already run) is
// skipped; one whose blocks do not fit stops admission.
//
// # LoRA adapters
//
// At most MaxLoRAs adapters are resident at once, and they stay resident
// after their requests end. Admitting a request of an adapter that is not
// resident loads it, into a free slot or in place of the least recently
// used idle one, and the step that admits it lasts LoRALoadTime longer
// (the whole batch waits for the load, as in vLLM); Stats.LoRALoads counts
// the loads.
//
// Each step has a budget of MaxNumBatchedTokens tokens. Every running
// request past its prefill takes one token (a decode); the rest of the
// budget goes to prefill chunks of the other running requests in admission
// order (chunked prefill). The step lasts
//
//	prefill_tokens_in_step / PrefillTokensPerSec
//	  + (TimePerOutputToken if the step has any decode)
//
// divided by Speedup. At the end of the step a request whose prefill is
// complete emits its first token (so time to first token is the prefill
// time of its uncached tokens, plus any wait for the step in progress), and
// every decode emits one more token. A request ends after MaxTokens tokens.
// Prefill throughput is shared: four concurrent 512-token prompts take as
// long as one 2048-token prompt. Busy steps run back to back; a step
// starts when the previous one ends, or when work arrives at an idle
// engine.
//
// # Prefix cache
//
// A request may bring TransferredTokens: a prompt whose KV cache was
// computed elsewhere (a disaggregated request's prefill pod) and arrives
// with it. They count as cached, up to all but the last prompt token.
//
// A request brings the chained hashes of its prompt's full blocks. At
// admission the longest run of its leading hashes already cached (limited
// to the first PromptTokens-1 tokens: the last prompt token is always
// computed) counts as cached and skips prefill. Full prompt blocks enter
// the cache when their prefill completes; blocks no running request uses
// stay cached until evicted, least recently used first, when a new request
// needs room.
//
// # Driving it
//
// Time is nanoseconds on the driver's clock. Submit and Abort change the
// queues; Advance(now) completes the step in progress if it has ended and
// returns what happened (Done, FirstToken); Schedule(now) admits waiting
// requests (Started) and starts the next step, returning when it ends, the
// one time the driver must call Advance again. At one instant a driver
// calls Advance, then any Submit and Abort, then Schedule, so that every
// request submitted at t joins the step that starts at t. Nothing happens
// between those times: a simulator jumps from one to the next. With
// Config.Coalesce a stretch of decode-only steps in which nothing can change
// is one step of the same length (Submit or Abort cut it where the step in
// progress ends), so a long generation costs O(1) wake-ups, not one per
// token; the timeline is identical either way (TestCoalesceIsExact).
//
// Invariants: every submitted request leaves exactly once (Done, or
// Abort); at most MaxNumSeqs run; blocks held plus idle cached blocks never
// exceed NumGPUBlocks, and return to zero held when nothing runs; a step's
// tokens never exceed MaxNumBatchedTokens; the waiting queue is admitted
// in order.
//
// Cost: Submit O(log n) for n waiting (O(1) under FCFS); Schedule O(k + a·b)
// for k prefill chunks in the step and a admissions of b blocks each;
// Advance O(k + f log r) for f requests finishing among r running (the
// decoding requests wait in a pkg/iheap heap keyed by their last step); no
// call is proportional to the running requests that merely decode. One
// goroutine owns an Engine; it reads no clock and starts no goroutine.
package engine
