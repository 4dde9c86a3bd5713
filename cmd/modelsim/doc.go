// Command modelsim is a vLLM-compatible model-server simulator: the OpenAI
// completions API with SSE streaming, vLLM's Prometheus metric names, and a
// timing model of continuous batching and prefix caching (see package
// internal/testbed/modelsim). It lets the picker run end to end without a GPU.
//
//	modelsim --host 127.0.0.2 --port 8000 --max-num-seqs 4 \
//	    --prefill-tokens-per-sec 20000 --time-per-output-token 20ms
//
// It stops gracefully on SIGTERM or SIGINT: running requests finish (for up
// to 10 s), new connections are refused.
package main
