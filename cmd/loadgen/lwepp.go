package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/laneway-dev/laneway/internal/testbed/load"
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

// spawnedBin is the epp binary spawn started (the follower of
// --compare-tickets runs it too).
var spawnedBin string

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
