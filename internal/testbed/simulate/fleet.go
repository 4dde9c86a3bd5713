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
}

// groupOf is one server with engine e.
func groupOf(e engine.Config) FleetGroup {
	return FleetGroup{Count: 1, MaxNumSeqs: e.MaxNumSeqs, MaxNumBatchedTokens: e.MaxNumBatchedTokens,
		PrefillTokensPerSec: e.PrefillTokensPerSec, TimePerOutputToken: e.TimePerOutputToken.String(),
		SchedulingPolicy: e.SchedulingPolicy, BlockSize: e.BlockSize, NumGPUBlocks: e.NumGPUBlocks,
		EnablePrefixCaching: e.EnablePrefixCaching}
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
	return cfg, cfg.Validate()
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
	for gi, raw := range ff.Servers {
		// The group's keys land on the flags' values: what it leaves out
		// (or sets to null) keeps them.
		g := groupOf(base)
		if err := yaml.UnmarshalStrict(raw, &g); err != nil {
			return nil, fmt.Errorf("fleet file %s: group %d: %w", path, gi+1, err)
		}
		cfg, err := g.engine(base)
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
			f.Servers = append(f.Servers, Server{Addr: serverAddr(len(f.Servers)), Engine: cfg})
		}
	}
	return f, nil
}
