package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/laneway-dev/laneway/test/load"
)

// lweppFlags are the flags of the side-by-side run with the upstream
// reference picker (SPEC §13). They live apart from flags so the
// comparison stays one block in run.
type lweppFlags struct {
	compare bool
	args    []string
}

// lw holds the parsed lweppFlags.
var lw lweppFlags

// spawnedEndpoint is the idle endpoint spawn started for Laneway; lwepp
// routes to the same address.
var spawnedEndpoint string

func (l *lweppFlags) register(fs *pflag.FlagSet) {
	fs.BoolVar(&l.compare, "compare-lwepp", false,
		"with --spawn: also start the upstream reference picker (cmd/lwepp of gateway-api-inference-extension, reading its own envtest API server; needs `make envtest`) "+
			"routing to the same endpoint, and measure laneway, lwepp, laneway again for every run")
	fs.StringSliceVar(&l.args, "lwepp-args", nil,
		"with --compare-lwepp: further lwepp flags, e.g. --lwepp-args=--zap-devel=false (named in every lwepp result); default: lwepp's own defaults")
}

// lweppLabel names lwepp's results, and how its logging was configured:
// its default (--zap-devel) logs several debug lines per request, which is
// part of what it costs.
func lweppLabel() string {
	if len(lw.args) == 0 {
		return "lwepp (its defaults: --zap-devel debug log on the request path, to a file)"
	}
	return fmt.Sprintf("lwepp (args %s)", strings.Join(lw.args, " "))
}

// compareLWEPP spawns lwepp next to the spawned Laneway (lane) and, for
// every run of the mode (one open loop, or
// each closed-loop level), measures Laneway, then lwepp, then Laneway
// again: alternating keeps the machine's drift from favouring either.
func compareLWEPP(ctx context.Context, f *flags, lane *picker, cfg load.Config, levels []int) error {
	if !f.spawn || spawnedEndpoint == "" {
		return errors.New("--compare-lwepp needs --spawn (lwepp must route to the spawned idle endpoint)")
	}
	ref, stop, err := spawnLWEPP(ctx, f)
	if err != nil {
		return err
	}
	defer stop()

	first, second := *lane, *lane
	first.label, second.label = "laneway (run 1 of 2)", "laneway (run 2 of 2)"
	sides := []*picker{&first, ref, &second}
	for _, c := range runConfigs(f, cfg, levels) {
		var res [3]load.Result
		for i, p := range sides {
			if res[i], err = p.run(ctx, f, c); err != nil {
				return fmt.Errorf("%s: %w", p.label, err)
			}
			if err := report(f, p, &res[i]); err != nil {
				return err
			}
		}
		if !f.jsonOut {
			fmt.Println(compareLine(res))
		}
	}
	return nil
}

// spawnLWEPP starts lwepp with its log in a temp dir (removed at clean-up
// unless lwepp failed) and connects to it as run does to Laneway.
func spawnLWEPP(ctx context.Context, f *flags) (*picker, func(), error) {
	dir, err := os.MkdirTemp("", "loadgen-lwepp-")
	if err != nil {
		return nil, nil, fmt.Errorf("temp dir: %w", err)
	}
	// lwepp writes its log to the file itself: copying its per-request
	// lines through a pipe would cost this process CPU while it measures.
	logPath := filepath.Join(dir, "lwepp.log")
	fmt.Fprintln(os.Stderr, "loadgen: starting an envtest API server and building "+load.LWEPPPackage)
	p, err := load.SpawnLWEPP(ctx, load.LWEPPOptions{TLS: f.tls, Endpoint: spawnedEndpoint, Args: lw.args, LogFile: logPath})
	if err != nil {
		load.RemoveLWEPPBinary()
		return nil, nil, fmt.Errorf("spawn lwepp: %w (lwepp log in %s)", err, logPath)
	}
	cleanup := func() {
		err := p.Stop(30 * time.Second)
		load.RemoveLWEPPBinary()
		if err != nil {
			fmt.Fprintf(os.Stderr, "loadgen: %v (lwepp log in %s)\n", err, logPath)
			return
		}
		os.RemoveAll(dir)
	}
	fmt.Fprintf(os.Stderr, "loadgen: spawned lwepp pid %d, ext_proc %s (tls %v), routing to %s; log %s\n",
		p.Cmd.Process.Pid, p.GRPCAddr, f.tls, p.Endpoint, logPath)

	ref, closeConns, err := connect(ctx, f, "lwepp", lweppLabel(), p.GRPCAddr, p.CPU())
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	return ref, func() { closeConns(); cleanup() }, nil
}

// compareLine sums up a laneway, lwepp, laneway triple on one line.
func compareLine(res [3]load.Result) string {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.3f", float64(d)/float64(time.Millisecond)) }
	cpu := func(r *load.Result) string {
		if !r.HasPickerCPU {
			return "n/a"
		}
		return fmt.Sprintf("%.4f", r.PickerCPUPer1000)
	}
	a, b, c := &res[0], &res[1], &res[2]
	return fmt.Sprintf("COMPARE  laneway p50 %s/%s p99 %s/%s max %s/%s ms, CPU %s/%s s per 1,000  |  lwepp p50 %s p99 %s max %s ms, CPU %s s per 1,000  (errors %d/%d/%d)\n",
		ms(a.Latency.P50), ms(c.Latency.P50), ms(a.Latency.P99), ms(c.Latency.P99), ms(a.Latency.Max), ms(c.Latency.Max), cpu(a), cpu(c),
		ms(b.Latency.P50), ms(b.Latency.P99), ms(b.Latency.Max), cpu(b), a.Errors, b.Errors, c.Errors)
}
