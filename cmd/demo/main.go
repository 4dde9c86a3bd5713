// Command demo runs Laneway's weighted-share demo end to end on this
// machine (see `make demo`): model-server simulator, endpoint picker and
// local gateway as real processes on loopback, 320 premium and 320 regular
// requests through the gateway, for quanta 512:128 and the 512:512 control.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/laneway-dev/laneway/internal/testbed/demo"
)

func main() {
	bin := flag.String("bin", "bin", "folder holding the epp, modelsim and gateway binaries")
	out := flag.String("out", "out/demo", "folder for policies, logs and the plot")
	per := flag.Int("per-class", 320, "requests per class")
	phases := flag.Bool("response-phases", true, "the gateway sends the response phases to the picker; false: header-only, as gateways that send none")
	threshold := flag.String("threshold", "auto", "both classes' prefill_busy_threshold: auto, or a token count (SPEC §11 names 1536)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	_, err := demo.Run(ctx, demo.Config{BinDir: *bin, OutDir: *out, PerClass: *per, HeaderOnly: !*phases, Threshold: *threshold, Out: os.Stdout, Progress: os.Stderr})
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}
