package simulate

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/laneway-dev/laneway/pkg/engine"
	"github.com/laneway-dev/laneway/pkg/sched"
)

// Server is one simulated model server.
type Server struct {
	// Addr is the server's endpoint address as the picker sees it.
	Addr string
	// Engine is its timing model.
	Engine engine.Config
	// Role is its part in a disaggregated pool (the pod label the picker
	// reads); KVTransferTime is how long a disaggregated request's KV
	// cache takes to reach it from its prefill pod, when it decodes one
	// (modelsim's --kv-transfer-time).
	Role           sched.Role
	KVTransferTime time.Duration
}

// Fleet is the model servers of a run.
type Fleet struct {
	Servers []Server
}

// maxServers bounds a fleet (the address scheme numbers ports from
// 10000).
const maxServers = 50000

// serverAddr is server i's address: one host, ports of equal width, so the
// picker's address order is the servers' order.
func serverAddr(i int) string { return "10.0.0.1:" + strconv.Itoa(10000+i) }

// NewFleet returns n servers with the same engine.
func NewFleet(n int, cfg engine.Config) (*Fleet, error) {
	if n < 1 || n > maxServers {
		return nil, fmt.Errorf("--servers %d: want 1..%d", n, maxServers)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	f := &Fleet{}
	for i := range n {
		f.Servers = append(f.Servers, Server{Addr: serverAddr(i), Engine: cfg})
	}
	return f, nil
}

// fleetFile is a fleet file: groups of servers, each a FleetGroup whose
// unset fields take the engine flags' values.
type fleetFile struct {
	Servers []json.RawMessage `json:"servers"`
}

// FleetGroup is a run of identical servers: how many, and their engine
// settings under the engine flags' names ("_" for "-"). It is a group of
// a fleet file and of summary.json's fleet alike.
type FleetGroup struct {
	Count               int     `json:"count"`
	MaxNumSeqs          int     `json:"max_num_seqs"`
	MaxNumBatchedTokens int     `json:"max_num_batched_tokens"`
	PrefillTokensPerSec float64 `json:"prefill_tokens_per_sec"`
	TimePerOutputToken  string  `json:"time_per_output_token"`
	SchedulingPolicy    string  `json:"scheduling_policy"`
	BlockSize           int     `json:"block_size"`
	NumGPUBlocks        int     `json:"num_gpu_blocks"`
	EnablePrefixCaching bool    `json:"enable_prefix_caching"`
	// MaxLoRAs and LoRALoadTime are the engine's adapter slots and load
	// cost (--max-loras, --lora-load-time).
	MaxLoRAs     int    `json:"max_loras"`
	LoRALoadTime string `json:"lora_load_time"`
	// Role is prefill, decode or prefill-decode ("" is prefill-decode);
	// KVTransferTime is modelsim's --kv-transfer-time of a decode server.
	Role           string `json:"role,omitempty"`
	KVTransferTime string `json:"kv_transfer_time,omitempty"`
}

// groupOf is one server with engine e.
func groupOf(e engine.Config) FleetGroup {
	return FleetGroup{Count: 1, MaxNumSeqs: e.MaxNumSeqs, MaxNumBatchedTokens: e.MaxNumBatchedTokens,
		PrefillTokensPerSec: e.PrefillTokensPerSec, TimePerOutputToken: e.TimePerOutputToken.String(),
		SchedulingPolicy: e.SchedulingPolicy, BlockSize: e.BlockSize, NumGPUBlocks: e.NumGPUBlocks,
		EnablePrefixCaching: e.EnablePrefixCaching, MaxLoRAs: e.MaxLoRAs, LoRALoadTime: e.LoRALoadTime.String()}
}

// groupOfServer is one server s as a group, role and KV transfer time
// included.
func groupOfServer(s Server) FleetGroup {
	g := groupOf(s.Engine)
	if s.Role != sched.RolePrefillDecode {
		g.Role = s.Role.String()
	}
	if s.KVTransferTime > 0 {
		g.KVTransferTime = s.KVTransferTime.String()
	}
	return g
}

// engine returns the group's engine: base with the group's settings.
func (g *FleetGroup) engine(base engine.Config) (engine.Config, error) {
	cfg := base
	cfg.MaxNumSeqs, cfg.MaxNumBatchedTokens = g.MaxNumSeqs, g.MaxNumBatchedTokens
	cfg.PrefillTokensPerSec, cfg.SchedulingPolicy = g.PrefillTokensPerSec, g.SchedulingPolicy
	cfg.BlockSize, cfg.NumGPUBlocks, cfg.EnablePrefixCaching = g.BlockSize, g.NumGPUBlocks, g.EnablePrefixCaching
	d, err := time.ParseDuration(g.TimePerOutputToken)
	if err != nil {
		return cfg, fmt.Errorf("time_per_output_token: %w", err)
	}
	cfg.TimePerOutputToken = d
	cfg.MaxLoRAs = g.MaxLoRAs
	if cfg.LoRALoadTime, err = time.ParseDuration(g.LoRALoadTime); err != nil {
		return cfg, fmt.Errorf("lora_load_time: %w", err)
	}
	return cfg, cfg.Validate()
}

// server returns the group's server at addr: its engine from base, and
// its role and KV transfer time (base's when the group names none).
func (g *FleetGroup) server(addr string, base Server) (Server, error) {
	cfg, err := g.engine(base.Engine)
	if err != nil {
		return Server{}, err
	}
	s := Server{Addr: addr, Engine: cfg, Role: base.Role, KVTransferTime: base.KVTransferTime}
	if g.Role != "" {
		r, err := sched.ParseRole(g.Role)
		if err != nil {
			return Server{}, fmt.Errorf("role: %w", err)
		}
		s.Role = r
	}
	if g.KVTransferTime != "" {
		d, err := time.ParseDuration(g.KVTransferTime)
		if err != nil || d < 0 {
			return Server{}, fmt.Errorf("kv_transfer_time %q: want a duration >= 0", g.KVTransferTime)
		}
		s.KVTransferTime = d
	}
	return s, nil
}

// LoadFleet reads a fleet file (YAML or JSON):
//
//	servers:
//	  - count: 6                       # servers in this group (default 1)
//	    max_num_seqs: 256              # any engine flag, "_" for "-";
//	  - count: 2                       # unset ones take the flags' values
//	    prefill_tokens_per_sec: 10000
//	    time_per_output_token: 30ms
//	  - count: 2                       # a disaggregated pool: prefill pods,
//	    role: prefill                  # decode pods (decode, prefill-decode);
//	  - count: 2                       # kv_transfer_time is a decode pod's
//	    role: decode                   # wait for a prefilled KV cache
//	    kv_transfer_time: 20ms
//	    max_loras: 2                   # adapter slots and their load cost
//	    lora_load_time: 200ms
//
// Unknown keys are an error.
func LoadFleet(path string, base engine.Config) (*Fleet, error) {
	return LoadFleetWith(path, Server{Engine: base})
}

// LoadFleetWith is LoadFleet with the defaults of a whole server (role
// and KV transfer time besides the engine).
func LoadFleetWith(path string, base Server) (*Fleet, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read fleet file: %w", err)
	}
	var ff fleetFile
	if err := yaml.UnmarshalStrict(data, &ff); err != nil {
		return nil, fmt.Errorf("fleet file %s: %w", path, err)
	}
	if len(ff.Servers) == 0 {
		return nil, fmt.Errorf("fleet file %s: no servers", path)
	}
	f := &Fleet{}
	for gi, raw := range ff.Servers {
		// The group's keys land on the flags' values: what it leaves out
		// (or sets to null) keeps them.
		g := groupOf(base.Engine)
		if err := yaml.UnmarshalStrict(raw, &g); err != nil {
			return nil, fmt.Errorf("fleet file %s: group %d: %w", path, gi+1, err)
		}
		proto, err := g.server("", base)
		if err != nil {
			return nil, fmt.Errorf("fleet file %s: group %d: %w", path, gi+1, err)
		}
		if g.Count < 1 {
			return nil, fmt.Errorf("fleet file %s: group %d: count %d: want >= 1", path, gi+1, g.Count)
		}
		for range g.Count {
			if len(f.Servers) == maxServers {
				return nil, errors.New("fleet file " + path + ": more than " + strconv.Itoa(maxServers) + " servers")
			}
			s := proto
			s.Addr = serverAddr(len(f.Servers))
			f.Servers = append(f.Servers, s)
		}
	}
	return f, nil
}
