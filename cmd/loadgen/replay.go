package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/internal/testbed/replay"
	"github.com/laneway-dev/laneway/internal/testbed/simulate"
)

// replayUsage heads `loadgen --trace --help`.
const replayUsage = `usage: loadgen (--trace FILE | --generate SPEC) (--spawn | --gateway URL) [laneway simulate's trace, fleet and policy flags]

Replays a trace open loop through the local gateway to the picker and
modelsim servers (--spawn starts them with the engine flags below), and
writes what laneway simulate writes for the same flags: DIR/<policy>/requests.jsonl,
DIR/summary.json, the table and the figures, plus the processes' logs in
DIR/logs. One policy per run: a policy file (the picker's --picker) or none.

flags:
`

// replayFlags are the replay's own flags besides simulate.Config's.
type replayFlags struct {
	spawn     bool
	binDir    string
	gateway   string
	endpoints []string
	eppArgs   []string
	simArgs   []string
	model     string
	// phases and connPerRequest are the spawned gateway's
	// --response-phases and --epp-conn-per-request.
	phases, connPerRequest bool
}

// maybeReplay runs the trace replay and exits when loadgen was started
// with --trace (or --generate, a synthetic trace); it returns otherwise.
func maybeReplay() {
	traced := false
	for _, a := range os.Args[1:] {
		for _, f := range []string{"--trace", "--generate"} {
			if a == f || strings.HasPrefix(a, f+"=") {
				traced = true
			}
		}
	}
	if !traced {
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := runReplay(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// runReplay is the replay mode: it returns the exit code (0 done, 1 the
// run failed, 2 a usage error).
func runReplay(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := simulate.DefaultConfig()
	c.Out = "replay-out"
	var rf replayFlags
	fs := pflag.NewFlagSet("loadgen --trace", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {}
	c.AddFlags(fs)
	fs.BoolVar(&rf.spawn, "spawn", false, "start the modelsim servers (the engine flags; --servers or --fleet), the picker and the gateway on loopback")
	fs.StringVar(&rf.binDir, "bin-dir", "", "with --spawn: the folder with the modelsim, epp and gateway binaries (default: build them from this module)")
	fs.StringVar(&rf.gateway, "gateway", "", "instead of --spawn: the base URL of a running gateway, e.g. http://127.0.0.1:8080")
	fs.StringSliceVar(&rf.endpoints, "endpoints", nil, "with --gateway: the servers' addresses in the fleet's order, so requests.jsonl numbers them as the simulation does (default: in order of first use)")
	fs.StringSliceVar(&rf.eppArgs, "epp-args", nil, "with --spawn: further picker flags")
	fs.StringSliceVar(&rf.simArgs, "modelsim-args", nil, "with --spawn: further flags of every modelsim")
	fs.StringVar(&rf.model, "model", replay.DefaultModel, "the model the requests name")
	fs.BoolVar(&rf.phases, "response-phases", true, "with --spawn: the gateway sends the picker the response phases; false: only the request, half-closing each stream, as gateways that send no response phase do (Envoy with them skipped)")
	fs.BoolVar(&rf.connPerRequest, "epp-conn-per-request", false, "with --spawn and --response-phases=false: a new connection to the picker for every request, as NGINX Gateway Fabric's endpoint-picker shim opens")
	help := fs.BoolP("help", "h", false, "show the flags")
	err := fs.Parse(args)
	if *help {
		fmt.Fprint(stdout, replayUsage+fs.FlagUsages())
		return 0
	}
	if err == nil {
		err = checkReplayFlags(fs, &c, &rf)
	}
	if err != nil {
		fmt.Fprintf(stderr, "loadgen --trace: %v (see --trace --help)\n", err)
		return 2
	}
	if err := replayMain(ctx, &c, &rf, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "loadgen --trace: %v\n", err)
		return 1
	}
	return 0
}

// checkReplayFlags refuses what a real run cannot do.
func checkReplayFlags(fs *pflag.FlagSet, c *simulate.Config, rf *replayFlags) error {
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case rf.spawn == (rf.gateway != ""):
		return errors.New("give --spawn or --gateway URL")
	case len(c.Policies) > 1:
		return errors.New("one --policy per real run (run again for another)")
	case len(c.Policies) == 1 && c.Policies[0] == simulate.BaselineRoundRobin:
		return errors.New("--policy round-robin: the picker has no round-robin choice (it is the simulator's model of the upstream picker)")
	case c.Retries != 0:
		return errors.New("--retry-429: a real run does not retry")
	case !rf.spawn && (rf.binDir != "" || len(rf.eppArgs) > 0 || len(rf.simArgs) > 0):
		return errors.New("--bin-dir, --epp-args and --modelsim-args go with --spawn")
	case rf.spawn && len(rf.endpoints) > 0:
		return errors.New("--endpoints goes with --gateway (with --spawn the servers are known)")
	case !rf.spawn && (!rf.phases || rf.connPerRequest):
		return errors.New("--response-phases and --epp-conn-per-request shape the spawned gateway: they go with --spawn")
	case rf.phases && rf.connPerRequest:
		return errors.New("--epp-conn-per-request goes with --response-phases=false (the shim it plays sends no response phase)")
	}
	return nil
}

// replayMain loads the trace, fleet and policy as `laneway simulate` does,
// starts the processes (--spawn), replays, and writes the outputs.
func replayMain(ctx context.Context, c *simulate.Config, rf *replayFlags, stdout, stderr io.Writer) (err error) {
	s, err := c.Load()
	if err != nil {
		return err
	}
	pol := s.Policies[0]
	opts := replay.Options{URL: strings.TrimSuffix(rf.gateway, "/"), Servers: rf.endpoints, Model: rf.model,
		Progress: func(done, total int) { fmt.Fprintf(stderr, "loadgen: %d of %d requests ended\n", done, total) }}
	var engines []*launch.MaxWatch
	var shape string
	if rf.spawn {
		fleet, err := spawnFleet(ctx, c, rf, s)
		if err != nil {
			return err
		}
		defer func() {
			if serr := fleet.Stop(); serr != nil && err == nil {
				err = serr
			}
		}()
		opts.URL, opts.Servers, shape = fleet.URL, fleet.Servers, fleet.Shape
		fmt.Fprintf(stderr, "loadgen: %d modelsim servers, the picker and the gateway (%s) at %s; replaying %d requests over %.1f s\n",
			len(fleet.Servers), shape, fleet.URL, len(s.Trace.Requests), s.Trace.Span().Seconds())
		// The engines' waiting queues, which no request's outcome shows:
		// the picker's busy test is meant to keep them short.
		for _, page := range fleet.Engines {
			engines = append(engines, page.WatchMax(engineWatchPeriod, "vllm:num_requests_waiting"))
		}
	}
	res, rerr := replay.Run(ctx, s.Trace, pol, opts)
	var waiting []string
	for i, w := range engines {
		most, samples, werr := w.Stop()
		if werr != nil {
			fmt.Fprintf(stderr, "loadgen: server %d: %v\n", i, werr)
		}
		waiting = append(waiting, fmt.Sprintf("real run: server %d: engine waiting queue at most %v requests over %d samples (vllm:num_requests_waiting every %v)",
			i, most, samples, engineWatchPeriod))
	}
	if res == nil {
		return rerr
	}
	if rerr != nil {
		fmt.Fprintf(stderr, "loadgen: %v\n", rerr)
	}
	sum := simulate.NewSummary(s.Trace, s.Fleet, c.Seed, []*simulate.Result{res})
	if err := os.MkdirAll(c.Out, 0o755); err != nil {
		return fmt.Errorf("output: %w", err)
	}
	if err := simulate.WriteOutputs(c.Out, s.Trace, []*simulate.Result{res}, sum); err != nil {
		return err
	}
	if err := simulate.WriteTable(stdout, sum); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "real run: prefix hit rate %.1f%%\n", 100*sum.Policies[0].PrefixHitRate)
	if shape != "" {
		fmt.Fprintf(stdout, "real run: gateway %s\n", shape)
	}
	for _, line := range waiting {
		fmt.Fprintln(stdout, line)
	}
	files := []string{filepath.Join(c.Out, "summary.json"), filepath.Join(c.Out, pol.Name, "requests.jsonl")}
	if !c.NoPlots {
		plots, err := simulate.WritePlots(c.Out, s.Trace, []*simulate.Result{res})
		if err != nil {
			return err
		}
		files = append(files, plots...)
	}
	for _, f := range files {
		fmt.Fprintln(stderr, "wrote", f)
	}
	return rerr
}

// engineWatchPeriod is how often a spawned server's waiting queue is
// sampled during the replay.
const engineWatchPeriod = 20 * time.Millisecond

// spawnFleet builds the binaries (unless --bin-dir) and starts the
// setup's fleet for its policy: the policy file and --picker, or none's
// (no policy file, the least-loaded pick).
func spawnFleet(ctx context.Context, c *simulate.Config, rf *replayFlags, s *simulate.Setup) (*replay.Fleet, error) {
	bins := launch.InDir(rf.binDir)
	if rf.binDir == "" {
		dir, err := os.MkdirTemp("", "loadgen-replay-")
		if err != nil {
			return nil, err
		}
		// The processes keep their binaries open: removing the folder
		// once they run frees it at their exit.
		defer os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, "loadgen: building modelsim, epp and gateway")
		if bins, err = launch.Build(dir, false, launch.CmdModelsim, launch.CmdEpp, launch.CmdGateway); err != nil {
			return nil, err
		}
	}
	p := s.Policies[0]
	fo := replay.FleetOptions{Bins: bins, Fleet: s.Fleet, Picker: p.Picker, ScrapeInterval: c.ScrapeInterval,
		PrefixCacheTTL: c.PrefixCacheTTL, EPPArgs: rf.eppArgs, SimArgs: rf.simArgs, LogDir: filepath.Join(c.Out, "logs"),
		HeaderOnly: !rf.phases, ConnPerRequest: rf.connPerRequest}
	if !p.Baseline {
		fo.Policy = c.Policies[0]
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	return replay.StartFleet(ctx, fo)
}
