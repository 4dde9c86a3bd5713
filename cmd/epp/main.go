// Command epp is Laneway's endpoint picker: an Envoy ext_proc server that
// holds inference requests in DRR policy-class lanes and tells the gateway
// which model-server endpoint serves each one.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/laneway-dev/laneway/internal/epp"
	"github.com/laneway-dev/laneway/internal/logging"
)

func main() {
	opts := epp.NewOptions()
	fs := pflag.NewFlagSet("epp", pflag.ExitOnError)
	opts.AddFlags(fs)
	_ = fs.Parse(os.Args[1:])
	if err := opts.Complete(); err != nil {
		fmt.Fprintln(os.Stderr, "epp:", err)
		os.Exit(2)
	}
	if err := opts.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "epp:", err)
		os.Exit(2)
	}
	log := logging.New(opts.Verbosity, os.Stderr)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	run := epp.Run // standalone: --endpoints and --policy-config
	if opts.Kubernetes() {
		run = epp.RunKube // --pool-name: the pool's pods and policy objects
	}
	if err := run(ctx, opts, log); err != nil {
		log.Error(err, "endpoint picker failed")
		os.Exit(1)
	}
}
