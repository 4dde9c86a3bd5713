package modelsim

import (
	"fmt"
	"math"
	"net"
	"strconv"
	"time"

	"github.com/spf13/pflag"
)

// Scheduling policies, as vLLM's --scheduling-policy names them.
const (
	PolicyFCFS     = "fcfs"
	PolicyPriority = "priority"
)

// Config is the simulator's configuration; AddFlags binds it to flags named
// like vLLM's.
type Config struct {
	// Host and Port are where the server listens.
	Host string
	Port int
	// Instance names this server in the x-modelsim-instance header and in
	// logs; empty means Host:Port.
	Instance string
	// Model is the served model name; LoRAAdapters are extra names served as
	// adapters of it.
	Model        string
	LoRAAdapters []string
	// MaxLoRAs is how many distinct adapters may run at once; 0 disables the
	// vllm:lora_requests_info series.
	MaxLoRAs int

	// MaxNumSeqs is the number of requests that run at once.
	MaxNumSeqs int
	// MaxNumBatchedTokens is the token budget of one engine step.
	MaxNumBatchedTokens int
	// MaxModelLen bounds prompt plus max_tokens of one request.
	MaxModelLen int
	// PrefillTokensPerSec is the prefill throughput of the whole engine.
	PrefillTokensPerSec float64
	// TimePerOutputToken is the duration of a step that decodes.
	TimePerOutputToken time.Duration
	// Speedup divides every duration of the timing model.
	Speedup float64
	// SchedulingPolicy is PolicyFCFS or PolicyPriority.
	SchedulingPolicy string

	// BlockSize is the KV cache block size in tokens.
	BlockSize int
	// NumGPUBlocks is the KV cache size in blocks.
	NumGPUBlocks int
	// EnablePrefixCaching turns prefix caching on.
	EnablePrefixCaching bool

	// DebugRecords is how many finished requests /debug/requests keeps.
	DebugRecords int
}

// DefaultConfig returns vLLM-like defaults (the demo overrides
// MaxNumSeqs to 4).
func DefaultConfig() Config {
	return Config{
		Host:                "127.0.0.1",
		Port:                8000,
		Model:               "sim-model",
		MaxNumSeqs:          256,
		MaxNumBatchedTokens: 8192,
		MaxModelLen:         32768,
		PrefillTokensPerSec: 20000,
		TimePerOutputToken:  20 * time.Millisecond,
		Speedup:             1,
		SchedulingPolicy:    PolicyFCFS,
		BlockSize:           16,
		NumGPUBlocks:        16384,
		EnablePrefixCaching: true,
		DebugRecords:        1024,
	}
}

// AddFlags binds c to fs; values already in c are the defaults.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Host, "host", c.Host, "address to listen on (a loopback address in tests)")
	fs.IntVar(&c.Port, "port", c.Port, "port to listen on (0 picks a free one)")
	fs.StringVar(&c.Instance, "instance", c.Instance, "name of this instance in the x-modelsim-instance header (default host:port)")
	fs.StringVar(&c.Model, "model", c.Model, "served model name")
	fs.StringSliceVar(&c.LoRAAdapters, "lora-modules", c.LoRAAdapters, "LoRA adapter names served besides the model")
	fs.IntVar(&c.MaxLoRAs, "max-loras", c.MaxLoRAs, "distinct LoRA adapters that may run at once (0: no LoRA metric)")
	fs.IntVar(&c.MaxNumSeqs, "max-num-seqs", c.MaxNumSeqs, "maximum number of requests running at once")
	fs.IntVar(&c.MaxNumBatchedTokens, "max-num-batched-tokens", c.MaxNumBatchedTokens, "token budget of one engine step")
	fs.IntVar(&c.MaxModelLen, "max-model-len", c.MaxModelLen, "maximum prompt plus max_tokens of a request")
	fs.Float64Var(&c.PrefillTokensPerSec, "prefill-tokens-per-sec", c.PrefillTokensPerSec, "prefill throughput of the engine, shared by concurrent prompts")
	fs.DurationVar(&c.TimePerOutputToken, "time-per-output-token", c.TimePerOutputToken, "duration of an engine step that decodes")
	fs.Float64Var(&c.Speedup, "speedup", c.Speedup, "divides every duration of the timing model")
	fs.StringVar(&c.SchedulingPolicy, "scheduling-policy", c.SchedulingPolicy, "fcfs, or priority (the request's priority field, lower first)")
	fs.IntVar(&c.BlockSize, "block-size", c.BlockSize, "KV cache block size in tokens")
	fs.IntVar(&c.NumGPUBlocks, "num-gpu-blocks", c.NumGPUBlocks, "KV cache size in blocks")
	fs.BoolVar(&c.EnablePrefixCaching, "enable-prefix-caching", c.EnablePrefixCaching, "reuse cached prompt blocks")
	fs.IntVar(&c.DebugRecords, "debug-records", c.DebugRecords, "finished requests kept for /debug/requests")
}

// Validate reports the first setting that cannot work.
func (c *Config) Validate() error {
	switch {
	case c.Port < 0 || c.Port > 65535:
		return fmt.Errorf("--port %d: want 0..65535", c.Port)
	case c.Model == "":
		return fmt.Errorf("--model is empty")
	case c.MaxLoRAs < 0:
		return fmt.Errorf("--max-loras %d: want >= 0", c.MaxLoRAs)
	case c.MaxNumSeqs < 1:
		return fmt.Errorf("--max-num-seqs %d: want >= 1", c.MaxNumSeqs)
	case c.MaxNumBatchedTokens < c.MaxNumSeqs:
		// Every running request must be able to decode in every step.
		return fmt.Errorf("--max-num-batched-tokens %d: want >= --max-num-seqs %d", c.MaxNumBatchedTokens, c.MaxNumSeqs)
	case !(c.PrefillTokensPerSec > 0) || math.IsInf(c.PrefillTokensPerSec, 0):
		return fmt.Errorf("--prefill-tokens-per-sec %v: want a positive number", c.PrefillTokensPerSec)
	case c.TimePerOutputToken < 0:
		return fmt.Errorf("--time-per-output-token %v: want >= 0", c.TimePerOutputToken)
	case !(c.Speedup > 0) || math.IsInf(c.Speedup, 0):
		return fmt.Errorf("--speedup %v: want a positive number", c.Speedup)
	case c.SchedulingPolicy != PolicyFCFS && c.SchedulingPolicy != PolicyPriority:
		return fmt.Errorf("--scheduling-policy %q: want %s or %s", c.SchedulingPolicy, PolicyFCFS, PolicyPriority)
	case c.BlockSize < 1:
		return fmt.Errorf("--block-size %d: want >= 1", c.BlockSize)
	case c.NumGPUBlocks < 1:
		return fmt.Errorf("--num-gpu-blocks %d: want >= 1", c.NumGPUBlocks)
	case c.MaxModelLen < 2:
		return fmt.Errorf("--max-model-len %d: want >= 2", c.MaxModelLen)
	case c.MaxModelLen > c.BlockSize*c.NumGPUBlocks:
		return fmt.Errorf("--max-model-len %d exceeds the KV cache (%d blocks of %d tokens)", c.MaxModelLen, c.NumGPUBlocks, c.BlockSize)
	case c.DebugRecords < 0:
		return fmt.Errorf("--debug-records %d: want >= 0", c.DebugRecords)
	}
	return nil
}

// Addr is the listen address.
func (c *Config) Addr() string { return net.JoinHostPort(c.Host, strconv.Itoa(c.Port)) }

// scale divides a model duration by the speedup.
func (c *Config) scale(d float64) time.Duration {
	return time.Duration(d / c.Speedup * float64(time.Second))
}

// PrefillTime is the modelled time to prefill tokens uncached prompt tokens
// when nothing else runs: the time to first token of a lone request.
func (c *Config) PrefillTime(tokens int) time.Duration {
	return c.scale(float64(tokens) / c.PrefillTokensPerSec)
}

// DecodeTime is the modelled time from the first to the last of
// outputTokens tokens when nothing else runs.
func (c *Config) DecodeTime(outputTokens int) time.Duration {
	if outputTokens <= 1 {
		return 0
	}
	return c.scale(float64(outputTokens-1) * c.TimePerOutputToken.Seconds())
}
