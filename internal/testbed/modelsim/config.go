package modelsim

import (
	"fmt"
	"math"
	"net"
	"strconv"
	"time"

	"github.com/spf13/pflag"

	"github.com/laneway-dev/laneway/pkg/engine"
)

// Scheduling policies, as vLLM's --scheduling-policy names them.
const (
	PolicyFCFS     = engine.PolicyFCFS
	PolicyPriority = engine.PolicyPriority
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
	// adapters of it. Config.MaxLoRAs is how many distinct adapters may run
	// at once; 0 disables the vllm:lora_requests_info series.
	Model        string
	LoRAAdapters []string

	// Config is the timing model (pkg/engine): slots, step budget,
	// prefill and decode speed, Speedup, scheduling policy, KV cache and
	// prefix caching. Its flags are shared with `laneway simulate`.
	engine.Config

	// MaxModelLen bounds prompt plus max_tokens of one request.
	MaxModelLen int

	// DebugRecords is how many finished requests /debug/requests keeps.
	DebugRecords int

	// Role is the server's part in a disaggregated pool (pd.go): RolePrefill
	// serves every request itself; RoleDecode and RolePrefillDecode act as
	// llm-d's decode sidecar for a request that names a prefill pod in
	// x-prefiller-host-port.
	Role string
	// KVTransferTime is how long a disaggregated request's KV cache takes
	// to arrive from its prefill pod, divided by Speedup like every
	// duration of the model.
	KVTransferTime time.Duration
}

// Roles of --role, the values of the llm-d.ai/role pod label.
const (
	RolePrefill       = "prefill"
	RoleDecode        = "decode"
	RolePrefillDecode = "prefill-decode"
)

// DefaultConfig returns vLLM-like defaults (the demo overrides
// MaxNumSeqs to 4).
func DefaultConfig() Config {
	return Config{
		Host:         "127.0.0.1",
		Port:         8000,
		Model:        "sim-model",
		Config:       engine.DefaultConfig(),
		MaxModelLen:  32768,
		DebugRecords: 1024,
		Role:         RolePrefillDecode,
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
	c.Config.AddFlags(fs)
	fs.IntVar(&c.MaxModelLen, "max-model-len", c.MaxModelLen, "maximum prompt plus max_tokens of a request")
	fs.Float64Var(&c.Speedup, "speedup", c.Speedup, "divides every duration of the timing model")
	fs.IntVar(&c.DebugRecords, "debug-records", c.DebugRecords, "finished requests kept for /debug/requests")
	fs.StringVar(&c.Role, "role", c.Role, "part in a disaggregated pool: prefill, decode or prefill-decode; decode and prefill-decode servers act as the decode sidecar for requests with x-prefiller-host-port (prefill there with max_tokens 1, wait --kv-transfer-time, decode here)")
	fs.DurationVar(&c.KVTransferTime, "kv-transfer-time", c.KVTransferTime, "time for a disaggregated request's KV cache to arrive from its prefill pod (divided by --speedup)")
}

// Validate reports the first setting that cannot work.
func (c *Config) Validate() error {
	switch {
	case c.Port < 0 || c.Port > 65535:
		return fmt.Errorf("--port %d: want 0..65535", c.Port)
	case c.Model == "":
		return fmt.Errorf("--model is empty")
	case !(c.Speedup > 0) || math.IsInf(c.Speedup, 0):
		return fmt.Errorf("--speedup %v: want a positive number", c.Speedup)
	}
	if err := c.Config.Validate(); err != nil {
		return err
	}
	switch {
	case c.MaxModelLen < 2:
		return fmt.Errorf("--max-model-len %d: want >= 2", c.MaxModelLen)
	case c.MaxModelLen > c.BlockSize*c.NumGPUBlocks:
		return fmt.Errorf("--max-model-len %d exceeds the KV cache (%d blocks of %d tokens)", c.MaxModelLen, c.NumGPUBlocks, c.BlockSize)
	case c.DebugRecords < 0:
		return fmt.Errorf("--debug-records %d: want >= 0", c.DebugRecords)
	case c.Role != RolePrefill && c.Role != RoleDecode && c.Role != RolePrefillDecode:
		return fmt.Errorf("--role %q: want %s, %s or %s", c.Role, RolePrefill, RoleDecode, RolePrefillDecode)
	case c.KVTransferTime < 0:
		return fmt.Errorf("--kv-transfer-time %v: want >= 0", c.KVTransferTime)
	}
	return nil
}

// Addr is the listen address.
func (c *Config) Addr() string { return net.JoinHostPort(c.Host, strconv.Itoa(c.Port)) }
