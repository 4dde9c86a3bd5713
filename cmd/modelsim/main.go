package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/spf13/pflag"

	"github.com/laneway-dev/laneway/internal/testbed/modelsim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "modelsim:", err)
		os.Exit(1)
	}
}

// run parses flags and serves until ctx ends.
func run(ctx context.Context, args []string) error {
	cfg := modelsim.DefaultConfig()
	fs := pflag.NewFlagSet("modelsim", pflag.ContinueOnError)
	cfg.AddFlags(fs)
	verbosity := fs.IntP("v", "v", 2, "log verbosity: 2 default, 3 verbose, 4 one line per request (priority and token counts, never prompt text)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := funcr.New(func(prefix, args string) {
		fmt.Fprintln(os.Stderr, time.Now().Format(time.RFC3339Nano), prefix, args)
	}, funcr.Options{Verbosity: *verbosity})
	ln, err := net.Listen("tcp", cfg.Addr())
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Addr(), err)
	}
	if cfg.Instance == "" {
		cfg.Instance = ln.Addr().String()
	}
	srv, err := modelsim.New(cfg, log)
	if err != nil {
		_ = ln.Close()
		return err
	}
	logStart(log, srv, ln, cfg)
	err = srv.Serve(ctx, ln)
	log.Info("stopped")
	return err
}

func logStart(log logr.Logger, srv *modelsim.Server, ln net.Listener, cfg modelsim.Config) {
	log.Info("serving", "addr", ln.Addr().String(), "instance", srv.Instance(), "model", cfg.Model,
		"maxNumSeqs", cfg.MaxNumSeqs, "maxNumBatchedTokens", cfg.MaxNumBatchedTokens,
		"prefillTokensPerSec", cfg.PrefillTokensPerSec, "timePerOutputToken", cfg.TimePerOutputToken.String(),
		"speedup", cfg.Speedup, "schedulingPolicy", cfg.SchedulingPolicy,
		"blockSize", cfg.BlockSize, "numGPUBlocks", cfg.NumGPUBlocks, "prefixCaching", cfg.EnablePrefixCaching,
		"role", cfg.Role, "kvTransferTime", cfg.KVTransferTime.String(), "maxLoras", cfg.MaxLoRAs, "loraLoadTime", cfg.LoRALoadTime.String())
}
