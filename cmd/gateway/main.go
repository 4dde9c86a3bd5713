// Command gateway is a local ext_proc gateway: an HTTP reverse proxy that
// asks Laneway's endpoint picker where each request goes, the way Envoy's
// ext_proc filter does, for running without Envoy. Production uses Envoy or
// another ext_proc gateway; see README.md.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/laneway-dev/laneway/internal/logging"
	"github.com/laneway-dev/laneway/internal/testbed/gateway"
)

func main() {
	cfg := gateway.NewConfig()
	fs := pflag.NewFlagSet("gateway", pflag.ExitOnError)
	cfg.AddFlags(fs)
	_ = fs.Parse(os.Args[1:])
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(2)
	}
	log := logging.New(cfg.Verbosity, os.Stderr)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := gateway.Run(ctx, cfg, log); err != nil {
		log.Error(err, "gateway failed")
		os.Exit(1)
	}
}
