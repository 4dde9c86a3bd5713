// Package modelsim is a vLLM-compatible model-server simulator: the OpenAI
// completions and chat completions API (streaming and not), vLLM's
// Prometheus metrics, and the timing model of pkg/engine (continuous
// batching, chunked prefill, max_num_seqs, max_num_batched_tokens, prefix
// caching with LRU eviction, priority scheduling) run on the wall clock, so
// the picker can be tested end to end without a GPU.
//
// One goroutine (Engine.run) owns the model: it completes each step when
// its end comes, hands the model the requests that arrived meanwhile,
// starts the next step and sleeps until it ends, streaming one token per
// step to each handler. The model's numbers therefore hold for a lone
// request: uncached/--prefill-tokens-per-sec to the first token and
// --time-per-output-token for each further one (Config.PrefillTime and
// Config.DecodeTime), divided by --speedup.
//
// Prompts are tokenized with package tokenize (exact for token-id prompts)
// and hashed per full block of --block-size tokens for the model's prefix
// cache. vllm:prefix_cache_queries_total and vllm:prefix_cache_hits_total
// count prompt tokens and cached tokens at admission, and each response's
// usage names its own hit as OpenAI's prompt_tokens_details.cached_tokens
// (vLLM's with --enable-prompt-tokens-details), so a client replaying a
// trace learns every request's hit.
//
// In a disaggregated pool (--role) a decode or prefill-decode server acts
// as llm-d's decode sidecar for a request with x-prefiller-host-port: it
// prefills on that server with max_tokens 1, waits --kv-transfer-time for
// the KV cache, then decodes with the prompt counted as cached (pd.go).
// /debug/requests records on both sides prove where each request was
// prefilled and decoded. LoRA adapters (--lora-modules, --max-loras) stay
// resident between requests; loading one costs --lora-load-time and counts
// in modelsim_lora_loads_total.
package modelsim
