package podmetrics

import (
	"fmt"
	"strings"
)

// Engine is the model-server engine whose metric names a page uses.
type Engine uint8

// Engines whose pages Parse reads (SPEC §9).
const (
	EngineVLLM   Engine = iota // vLLM (the zero value)
	EngineSGLang               // SGLang
	EngineTRTLLM               // TensorRT-LLM's trtllm-serve
)

// String returns the engine's configuration name.
func (e Engine) String() string {
	switch e {
	case EngineVLLM:
		return "vllm"
	case EngineSGLang:
		return "sglang"
	case EngineTRTLLM:
		return "trtllm"
	}
	return fmt.Sprintf("Engine(%d)", uint8(e))
}

// ParseEngine reads a configuration name: vllm, sglang or trtllm (any case,
// surrounding space ignored; trt-llm and tensorrt-llm also name TensorRT-LLM).
// It accepts what policy.ParseEngine accepts, so --engine-type and the pod
// label inference.networking.k8s.io/engine-type read alike.
func ParseEngine(s string) (Engine, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "vllm":
		return EngineVLLM, nil
	case "sglang":
		return EngineSGLang, nil
	case "trtllm", "trt-llm", "tensorrt-llm":
		return EngineTRTLLM, nil
	}
	return 0, fmt.Errorf("unknown engine %q (want vllm, sglang or trtllm)", s)
}

// Field names one value of Metrics; Metrics.Known is a set of them.
type Field uint16

// Fields of Metrics.
const (
	Waiting Field = 1 << iota
	Running
	KVCacheUsage
	BlockSize
	NumBlocks
	LoRA
	PromptTokens
	GenerationTokens
	Finished
)

var fieldNames = [...]string{"waiting", "running", "kv_cache_usage", "block_size", "num_blocks", "lora", "prompt_tokens", "generation_tokens", "finished"}

// String lists the fields in the set, like "waiting|running".
func (f Field) String() string {
	if f == 0 {
		return "none"
	}
	var parts []string
	for i, n := range fieldNames {
		if f&(1<<i) != 0 {
			parts = append(parts, n)
		}
	}
	if rest := f &^ (1<<len(fieldNames) - 1); rest != 0 {
		parts = append(parts, fmt.Sprintf("Field(%#x)", uint16(rest)))
	}
	return strings.Join(parts, "|")
}

// Metrics is one scrape of a pod, engine-neutral. A field not in Known was
// missing from the page (or unusable) and its value is zero: callers must
// treat it as unknown, never as idle.
type Metrics struct {
	// Known is the set of fields the page provided.
	Known Field
	// Waiting and Running are the engine's queued and running requests,
	// summed over the page's series (several engines behind one server
	// each export their own).
	Waiting, Running int
	// KVCacheUsage is the fraction of KV cache in use, 0..1 (the largest
	// over the page's series).
	KVCacheUsage float64
	// BlockSize is the KV cache block (page) size in tokens, and NumBlocks
	// the cache size in blocks.
	BlockSize, NumBlocks int
	// LoRA is vLLM's adapter state, from the newest lora_requests_info
	// series.
	LoRA LoRAInfo
	// PromptTokens is the engine's counter of prompt tokens whose prefill
	// it finished (vLLM's and SGLang's prompt_tokens_total, summed over
	// the page's series): it grows by a request's whole prompt when the
	// request leaves prefill. It is the ground truth the picker reconciles
	// its own prefill accounting against; TRT-LLM serve exports none.
	PromptTokens float64
	// GenerationTokens is the engine's counter of output tokens it
	// generated, and Finished its counter of requests it finished (vLLM's
	// generation_tokens_total and request_success_total, SGLang's
	// generation_tokens_total and num_requests_total; summed over the
	// page's series and labels). Their growth gives the mean output of
	// the requests the engine finishes, which the auto threshold weighs
	// against what the requests asked for (pkg/autothreshold).
	GenerationTokens, Finished float64
}

// Has reports whether every field in f is known.
func (m *Metrics) Has(f Field) bool { return m.Known&f == f }

// LoRAInfo is the adapter state of a vLLM server.
type LoRAInfo struct {
	// Running and Waiting are the adapters of running and waiting
	// requests; nil when none.
	Running, Waiting []string
	// MaxLoRA is how many adapters may run at once (0 if not reported).
	MaxLoRA int
	// UpdatedAt is the series value: the Unix time, in seconds, at which
	// the engine last reported this state.
	UpdatedAt float64
}
