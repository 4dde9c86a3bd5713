package engine

import (
	"fmt"
	"math"
	"time"

	"github.com/spf13/pflag"
)

// Scheduling policies of the waiting queue, as vLLM's --scheduling-policy
// names them.
const (
	PolicyFCFS     = "fcfs"
	PolicyPriority = "priority"
)

// Config is the timing model's parameters. AddFlags binds them to flags
// named like vLLM's, which cmd/modelsim and `laneway simulate` share.
type Config struct {
	// MaxNumSeqs is the number of requests that run at once.
	MaxNumSeqs int
	// MaxNumBatchedTokens is the token budget of one engine step.
	MaxNumBatchedTokens int
	// PrefillTokensPerSec is the prefill throughput of the whole engine.
	PrefillTokensPerSec float64
	// TimePerOutputToken is the duration of a step that decodes.
	TimePerOutputToken time.Duration
	// Speedup divides every duration of the timing model; 0 counts as 1.
	Speedup float64
	// SchedulingPolicy is PolicyFCFS or PolicyPriority.
	SchedulingPolicy string
	// MaxLoRAs is how many distinct adapters may run at once, and how
	// many stay resident (loaded) between requests; 0 means no bound.
	MaxLoRAs int
	// LoRALoadTime is what loading an adapter that is not resident costs:
	// the step that admits its request lasts that much longer.
	LoRALoadTime time.Duration

	// BlockSize is the KV cache block size in tokens.
	BlockSize int
	// NumGPUBlocks is the KV cache size in blocks.
	NumGPUBlocks int
	// EnablePrefixCaching turns prefix caching on.
	EnablePrefixCaching bool

	// MaxLag is how far behind a step's scheduled start a wall-clock
	// driver may be before the engine stops catching up and starts the
	// step at the time it is given. Busy steps otherwise run back to back
	// from their scheduled ends, so timer lateness does not add up over a
	// long generation. A virtual-clock driver is never late.
	MaxLag time.Duration
	// Coalesce runs a stretch of decode-only steps in which nothing can
	// change (no prefill, no finish, nothing admissible) as one step: the
	// same timeline in O(1) instead of one step per token. A Submit or
	// Abort inside the stretch cuts it at the step then in progress. A
	// driver that streams tokens step by step (cmd/modelsim) leaves it off.
	Coalesce bool
}

// DefaultConfig returns vLLM-like defaults.
func DefaultConfig() Config {
	return Config{
		MaxNumSeqs:          256,
		MaxNumBatchedTokens: 8192,
		PrefillTokensPerSec: 20000,
		TimePerOutputToken:  20 * time.Millisecond,
		Speedup:             1,
		SchedulingPolicy:    PolicyFCFS,
		BlockSize:           16,
		NumGPUBlocks:        16384,
		EnablePrefixCaching: true,
	}
}

// AddFlags binds the engine flags to fs; values already in c are the
// defaults. Speedup, MaxLoRAs, MaxLag and Coalesce have no flag here: they
// belong to the driver.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.IntVar(&c.MaxNumSeqs, "max-num-seqs", c.MaxNumSeqs, "maximum number of requests running at once")
	fs.IntVar(&c.MaxNumBatchedTokens, "max-num-batched-tokens", c.MaxNumBatchedTokens, "token budget of one engine step")
	fs.Float64Var(&c.PrefillTokensPerSec, "prefill-tokens-per-sec", c.PrefillTokensPerSec, "prefill throughput of the engine, shared by concurrent prompts")
	fs.DurationVar(&c.TimePerOutputToken, "time-per-output-token", c.TimePerOutputToken, "duration of an engine step that decodes")
	fs.StringVar(&c.SchedulingPolicy, "scheduling-policy", c.SchedulingPolicy, "fcfs, or priority (the request's priority field, lower first)")
	fs.IntVar(&c.BlockSize, "block-size", c.BlockSize, "KV cache block size in tokens")
	fs.IntVar(&c.NumGPUBlocks, "num-gpu-blocks", c.NumGPUBlocks, "KV cache size in blocks")
	fs.BoolVar(&c.EnablePrefixCaching, "enable-prefix-caching", c.EnablePrefixCaching, "reuse cached prompt blocks")
	fs.DurationVar(&c.LoRALoadTime, "lora-load-time", c.LoRALoadTime, "time to load a LoRA adapter that is not resident; the engine step that loads it lasts that much longer")
}

// Args returns c as the command-line flags AddFlags defines, one
// "--name=value" each, so that a process started with them (cmd/modelsim)
// runs the engine a simulation of c models.
func (c Config) Args() []string {
	fs := pflag.NewFlagSet("engine", pflag.ContinueOnError)
	c.AddFlags(fs)
	var args []string
	fs.VisitAll(func(f *pflag.Flag) { args = append(args, "--"+f.Name+"="+f.Value.String()) })
	return args
}

// Validate reports the first setting that cannot work, naming its flag.
func (c *Config) Validate() error {
	switch {
	case c.MaxNumSeqs < 1:
		return fmt.Errorf("--max-num-seqs %d: want >= 1", c.MaxNumSeqs)
	case c.MaxNumBatchedTokens < c.MaxNumSeqs:
		// Every running request must be able to decode in every step.
		return fmt.Errorf("--max-num-batched-tokens %d: want >= --max-num-seqs %d", c.MaxNumBatchedTokens, c.MaxNumSeqs)
	case !(c.PrefillTokensPerSec > 0) || math.IsInf(c.PrefillTokensPerSec, 0):
		return fmt.Errorf("--prefill-tokens-per-sec %v: want a positive number", c.PrefillTokensPerSec)
	case c.TimePerOutputToken < 0:
		return fmt.Errorf("--time-per-output-token %v: want >= 0", c.TimePerOutputToken)
	case c.Speedup != 0 && (!(c.Speedup > 0) || math.IsInf(c.Speedup, 0)):
		return fmt.Errorf("--speedup %v: want a positive number", c.Speedup)
	case c.SchedulingPolicy != PolicyFCFS && c.SchedulingPolicy != PolicyPriority:
		return fmt.Errorf("--scheduling-policy %q: want %s or %s", c.SchedulingPolicy, PolicyFCFS, PolicyPriority)
	case c.MaxLoRAs < 0:
		return fmt.Errorf("--max-loras %d: want >= 0", c.MaxLoRAs)
	case c.LoRALoadTime < 0:
		return fmt.Errorf("--lora-load-time %v: want >= 0", c.LoRALoadTime)
	case c.BlockSize < 1:
		return fmt.Errorf("--block-size %d: want >= 1", c.BlockSize)
	case c.NumGPUBlocks < 1:
		return fmt.Errorf("--num-gpu-blocks %d: want >= 1", c.NumGPUBlocks)
	case c.MaxLag < 0:
		return fmt.Errorf("max lag %v: want >= 0", c.MaxLag)
	}
	return nil
}

// scale turns model seconds into a duration, divided by the speedup.
func (c *Config) scale(seconds float64) time.Duration {
	s := c.Speedup
	if s == 0 {
		s = 1
	}
	return time.Duration(seconds / s * float64(time.Second))
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

// stepTime is the duration of one step with prefill prompt tokens and,
// when decodes, at least one decode.
func (c *Config) stepTime(prefill int, decodes bool) time.Duration {
	d := c.scale(float64(prefill) / c.PrefillTokensPerSec)
	if decodes {
		d += c.scale(c.TimePerOutputToken.Seconds())
	}
	return d
}

// Blocks is the KV blocks a request holds while it runs: its prompt plus
// every output token, rounded up to whole blocks.
func (c *Config) Blocks(promptTokens, maxTokens int) int {
	bs := c.BlockSize
	return (promptTokens + maxTokens + bs - 1) / bs
}
