package replay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/laneway-dev/laneway/internal/testbed/gateway"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/internal/testbed/simulate"
	"github.com/laneway-dev/laneway/pkg/engine"
	"github.com/laneway-dev/laneway/pkg/sched"
)

// FleetOptions describe the processes of a replay.
type FleetOptions struct {
	// Bins are the modelsim, epp and gateway binaries.
	Bins launch.Binaries
	// Fleet gives one modelsim per server, started with its engine's
	// flags (engine.Config.Args) and a --max-model-len of its whole KV
	// cache, so every request a simulation of the fleet accepts fits.
	Fleet *simulate.Fleet
	// Host is the servers' address (default 127.0.0.1).
	Host string
	// Policy is the picker's --policy-config ("": none, the picker's
	// synthetic default class).
	Policy string
	// Picker is the picker's --picker (default: the picker's own).
	Picker string
	// ScrapeInterval and PrefixCacheTTL are the picker's flags of those
	// names (0: the picker's defaults, 100 ms and 10 minutes).
	ScrapeInterval time.Duration
	PrefixCacheTTL time.Duration
	// EPPArgs and SimArgs are further flags of the picker and of every
	// modelsim.
	EPPArgs, SimArgs []string
	// LogDir, when set, receives every process's log at Stop.
	LogDir string
	// HeaderOnly and ConnPerRequest are the gateway's
	// --response-phases=false and --epp-conn-per-request: a gateway that
	// sends the picker no response phase (Envoy with them skipped; with
	// ConnPerRequest too, NGINX Gateway Fabric's endpoint-picker shim).
	HeaderOnly, ConnPerRequest bool
}

// Fleet is a running replay fleet: modelsim servers, the picker and the
// gateway.
type Fleet struct {
	// URL is the gateway's base URL; Servers the servers' addresses in
	// the fleet's order.
	URL     string
	Servers []string
	// EPP is the picker; Engines the servers' /metrics pages in the
	// fleet's order; Shape the gateway's ext_proc shape ("envoy",
	// "envoy-skip" or "nginx-shim").
	EPP     *launch.EPP
	Engines []launch.Page
	Shape   string

	procs  []*launch.Proc
	logDir string
	tmpDir string // the picker's endpoints file, when the fleet has roles
}

// StartFleet starts the servers, the picker and the gateway, and returns
// once the picker has a fresh scrape of every server (it avoids a server
// it has not scraped yet, which a simulation's picker never does). On an
// error it stops what it started.
func StartFleet(ctx context.Context, o FleetOptions) (_ *Fleet, err error) {
	if o.Fleet == nil || len(o.Fleet.Servers) == 0 {
		return nil, errors.New("replay: no servers")
	}
	f := &Fleet{logDir: o.LogDir}
	defer func() {
		if err != nil {
			_ = f.Stop()
		}
	}()
	proc := func(name string) launch.ProcOptions {
		return launch.ProcOptions{Name: name, LogLimit: 4 << 20, ReadyTimeout: time.Minute}
	}
	forward := false
	for i, s := range o.Fleet.Servers {
		sim, err := o.Bins.StartSim(ctx, launch.SimOptions{Host: cmp.Or(o.Host, "127.0.0.1"),
			Args: slices.Concat(ServerArgs(s.Engine), RoleArgs(s), o.SimArgs), Proc: proc(fmt.Sprintf("modelsim-%d", i))})
		if err != nil {
			return nil, err
		}
		f.procs = append(f.procs, sim.Proc)
		f.Servers = append(f.Servers, sim.Addr)
		f.Engines = append(f.Engines, sim.Metrics)
		forward = forward || s.Engine.SchedulingPolicy == engine.PolicyPriority
	}
	args := []string{"--max-num-batched-tokens=" + strconv.Itoa(o.Fleet.Servers[0].Engine.MaxNumBatchedTokens)}
	if o.Picker != "" {
		args = append(args, "--picker="+o.Picker)
	}
	if o.ScrapeInterval > 0 {
		args = append(args, "--scrape-interval="+o.ScrapeInterval.String())
	}
	if o.PrefixCacheTTL > 0 {
		args = append(args, "--prefix-cache-ttl="+o.PrefixCacheTTL.String())
	}
	if forward {
		// The simulator hands a priority-scheduling engine the request's
		// priority; the picker does so with this flag.
		args = append(args, "--forward-priority")
	}
	endpoints := f.Servers
	if text := EndpointsFile(o.Fleet, f.Servers); text != "" {
		// Roles reach the picker only through an endpoints file.
		if f.tmpDir, err = os.MkdirTemp("", "laneway-replay-"); err != nil {
			return nil, err
		}
		file := filepath.Join(f.tmpDir, "endpoints")
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			return nil, err
		}
		endpoints, args = nil, append(args, "--endpoints-file="+file)
	}
	epp, err := o.Bins.StartEPP(ctx, launch.EPPOptions{Endpoints: endpoints, Policy: o.Policy,
		Args: append(args, o.EPPArgs...), Proc: proc("epp")})
	if err != nil {
		return nil, err
	}
	f.EPP = epp
	f.procs = append(f.procs, epp.Proc)
	gw, err := o.Bins.StartGateway(ctx, launch.GatewayOptions{EPP: epp, HeaderOnly: o.HeaderOnly,
		ConnPerRequest: o.ConnPerRequest, Proc: proc("gateway")})
	if err != nil {
		return nil, err
	}
	gc := gateway.Config{ResponsePhases: !o.HeaderOnly, ConnPerRequest: o.ConnPerRequest}
	f.Shape = gc.Shape().String()
	f.procs = append(f.procs, gw.Proc)
	f.URL = gw.URL
	if err := AwaitScraped(ctx, epp.Metrics, len(f.Servers)); err != nil {
		return nil, err
	}
	return f, nil
}

// ServerArgs are the modelsim flags of a server with engine e: the engine
// flags, its speedup, and a --max-model-len of its whole KV cache.
func ServerArgs(e engine.Config) []string {
	args := append(e.Args(), "--max-model-len="+strconv.Itoa(e.BlockSize*e.NumGPUBlocks))
	if e.Speedup != 0 && e.Speedup != 1 {
		args = append(args, "--speedup="+strconv.FormatFloat(e.Speedup, 'g', -1, 64))
	}
	return args
}

// RoleArgs are the modelsim flags of server s's part in a disaggregated
// pool: its role, and the KV transfer wait of a server that decodes for
// prefill pods, multiplied by its engine's speedup (modelsim divides every
// model time by it; the simulator waits the transfer time as given). None
// for a prefill-decode server without a transfer time.
func RoleArgs(s simulate.Server) []string {
	var args []string
	if s.Role != sched.RolePrefillDecode {
		args = append(args, "--role="+s.Role.String())
	}
	if s.KVTransferTime > 0 {
		d := s.KVTransferTime
		if sp := s.Engine.Speedup; sp > 0 && sp != 1 {
			d = time.Duration(float64(d) * sp)
		}
		args = append(args, "--kv-transfer-time="+d.String())
	}
	return args
}

// EndpointsFile is the picker's --endpoints-file for a fleet with roles,
// whose servers run at addrs (in the fleet's order): one "ip:port role"
// line each. "" when every server is prefill-decode (--endpoints does).
func EndpointsFile(fl *simulate.Fleet, addrs []string) string {
	if !slices.ContainsFunc(fl.Servers, func(s simulate.Server) bool { return s.Role != sched.RolePrefillDecode }) {
		return ""
	}
	var b strings.Builder
	for i, s := range fl.Servers {
		fmt.Fprintf(&b, "%s %s\n", addrs[i], s.Role)
	}
	return b.String()
}

// Stop stops the gateway, the picker and the servers, in that order, and
// writes their logs to LogDir.
func (f *Fleet) Stop() error {
	var errs []error
	for i := len(f.procs) - 1; i >= 0; i-- {
		p := f.procs[i]
		if err := p.Stop(20 * time.Second); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w\n%s", p.Name, err, p.Log.Tail(2000)))
		}
		if f.logDir != "" {
			if err := os.MkdirAll(f.logDir, 0o755); err != nil {
				errs = append(errs, err)
				continue
			}
			name := strings.NewReplacer(":", "_", " ", "_", "/", "_").Replace(p.Name) + ".log"
			if err := os.WriteFile(filepath.Join(f.logDir, name), []byte(p.Log.String()), 0o644); err != nil {
				errs = append(errs, err)
			}
		}
	}
	f.procs = nil
	if f.tmpDir != "" {
		if err := os.RemoveAll(f.tmpDir); err != nil {
			errs = append(errs, err)
		}
		f.tmpDir = ""
	}
	return errors.Join(errs...)
}

// AwaitScraped polls the picker's metrics until n endpoints report fresh
// metrics (laneway_endpoint_metrics_stale 0 on each), for at most a
// minute: a real picker avoids an endpoint it has not scraped yet, which
// a simulated one never does, so a run compared with a simulation starts
// after it.
func AwaitScraped(ctx context.Context, page launch.Page, n int) error {
	const series = "laneway_endpoint_metrics_stale"
	deadline := time.Now().Add(time.Minute)
	for {
		m, err := page.Scrape(ctx)
		if err == nil {
			if stale, _ := m.Sum(series); stale == 0 && len(m.LabelValues(series, "endpoint")) == n {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replay: the picker has no fresh metrics of all %d servers after a minute (last scrape error: %v)", n, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
