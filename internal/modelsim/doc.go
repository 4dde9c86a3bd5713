// Package modelsim is a vLLM-compatible model-server simulator: the OpenAI
// completions and chat completions API (streaming and not), vLLM's
// Prometheus metrics, and a timing model of continuous batching with
// prefix caching, so the picker can be tested end to end without a GPU.
//
// # Timing model
//
// One goroutine (the engine) runs steps, as vLLM's engine core does. Before
// each step it moves waiting requests into free slots (at most
// --max-num-seqs running), in arrival order, or by the request's "priority"
// (lower first, ties by arrival) under --scheduling-policy priority. A
// request is admitted only if the KV cache can hold its prompt plus
// max_tokens; blocks are reserved for the whole request at admission, so
// there is no preemption.
//
// Each step has a budget of --max-num-batched-tokens tokens. Every running
// request past its prefill takes one token (a decode); the rest of the budget
// goes to prefill chunks of the other running requests in admission order
// (chunked prefill). The step lasts
//
//	prefill_tokens_in_step / --prefill-tokens-per-sec
//	  + (--time-per-output-token if the step has any decode)
//
// divided by --speedup. At the end of the step a request whose prefill is
// complete emits its first token (so time to first token is the prefill
// time of its uncached tokens, plus any wait for the step in progress), and
// every decode emits one more token. A request ends after max_tokens tokens.
// A lone request therefore takes uncached/speed for its first token and
// time-per-output-token for each further token, which Config.PrefillTime and
// Config.DecodeTime compute. Prefill throughput is shared: four concurrent
// 512-token prompts take as long as one 2048-token prompt.
//
// # Prefix cache
//
// Prompts are tokenized with package tokenize (exact for token-id prompts)
// and hashed per full block of --block-size tokens. When a request is
// admitted, the longest run of its leading block hashes already in the cache
// (limited to the first prompt_tokens-1 tokens, as vLLM always computes the
// last token) counts as cached and skips prefill. Full prompt blocks enter the
// cache when their prefill completes; blocks no running request uses stay
// cached until evicted, least recently used first, when a new request needs
// room. vllm:prefix_cache_queries_total and vllm:prefix_cache_hits_total count
// prompt tokens and cached tokens at admission.
package modelsim
