package simulate

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/laneway-dev/laneway/pkg/engine"
)

// Server is one simulated model server.
type Server struct {
	// Addr is the server's endpoint address as the picker sees it.
	Addr string
	// Engine is its timing model.
	Engine engine.Config
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

// fleetFile is a fleet file: groups of servers, each overriding some of
// the engine flags (the flag names with "_" for "-").
type fleetFile struct {
	Servers []fleetGroup `json:"servers"`
}

type fleetGroup struct {
	Count               *int     `json:"count"`
	MaxNumSeqs          *int     `json:"max_num_seqs"`
	MaxNumBatchedTokens *int     `json:"max_num_batched_tokens"`
	PrefillTokensPerSec *float64 `json:"prefill_tokens_per_sec"`
	TimePerOutputToken  *string  `json:"time_per_output_token"`
	SchedulingPolicy    *string  `json:"scheduling_policy"`
	BlockSize           *int     `json:"block_size"`
	NumGPUBlocks        *int     `json:"num_gpu_blocks"`
	EnablePrefixCaching *bool    `json:"enable_prefix_caching"`
}

// LoadFleet reads a fleet file (YAML or JSON):
//
//	servers:
//	  - count: 6                       # servers in this group (default 1)
//	    max_num_seqs: 256              # any engine flag, "_" for "-";
//	  - count: 2                       # unset ones take the flags' values
//	    prefill_tokens_per_sec: 10000
//	    time_per_output_token: 30ms
//
// Unknown keys are an error.
func LoadFleet(path string, base engine.Config) (*Fleet, error) {
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
	for gi, g := range ff.Servers {
		cfg := base
		set := func(dst *int, v *int) {
			if v != nil {
				*dst = *v
			}
		}
		set(&cfg.MaxNumSeqs, g.MaxNumSeqs)
		set(&cfg.MaxNumBatchedTokens, g.MaxNumBatchedTokens)
		set(&cfg.BlockSize, g.BlockSize)
		set(&cfg.NumGPUBlocks, g.NumGPUBlocks)
		if g.PrefillTokensPerSec != nil {
			cfg.PrefillTokensPerSec = *g.PrefillTokensPerSec
		}
		if g.TimePerOutputToken != nil {
			d, err := time.ParseDuration(*g.TimePerOutputToken)
			if err != nil {
				return nil, fmt.Errorf("fleet file %s: group %d: time_per_output_token: %w", path, gi+1, err)
			}
			cfg.TimePerOutputToken = d
		}
		if g.SchedulingPolicy != nil {
			cfg.SchedulingPolicy = *g.SchedulingPolicy
		}
		if g.EnablePrefixCaching != nil {
			cfg.EnablePrefixCaching = *g.EnablePrefixCaching
		}
		if err := cfg.Validate(); err != nil {
			return nil, fmt.Errorf("fleet file %s: group %d: %w", path, gi+1, err)
		}
		n := 1
		if g.Count != nil {
			n = *g.Count
		}
		if n < 1 {
			return nil, fmt.Errorf("fleet file %s: group %d: count %d: want >= 1", path, gi+1, n)
		}
		for range n {
			if len(f.Servers) == maxServers {
				return nil, errors.New("fleet file " + path + ": more than " + strconv.Itoa(maxServers) + " servers")
			}
			f.Servers = append(f.Servers, Server{Addr: serverAddr(len(f.Servers)), Engine: cfg})
		}
	}
	return f, nil
}
