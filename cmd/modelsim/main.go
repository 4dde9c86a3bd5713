// Command modelsim is a vLLM-compatible model-server simulator: the OpenAI
// completions API with SSE streaming, vLLM's Prometheus metric names, and a
// timing model of continuous batching and prefix caching (see package
// internal/modelsim). It lets the picker run end to end without a GPU.
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

	"github.com/laneway-dev/laneway/internal/modelsim"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "modelsim:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
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
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
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
		"blockSize", cfg.BlockSize, "numGPUBlocks", cfg.NumGPUBlocks, "prefixCaching", cfg.EnablePrefixCaching)
}
