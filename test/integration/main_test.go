package integration

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/laneway-dev/laneway/internal/testproc"
)

// eppBinary is the endpoint picker built once by TestMain for every test.
var eppBinary string

// raceEPP builds the picker with the race detector, so that data races in
// the real binary under these workloads fail the suite (the picker's log
// shows the report). It costs a slower build and picker; CI turns it on.
var raceEPP = flag.Bool("epp-race", os.Getenv("LANEWAY_EPP_RACE") == "1", "build the epp binary with -race")

func TestMain(m *testing.M) {
	flag.Parse()
	bins, cleanup, err := testproc.BuildAll("laneway-integration-", *raceEPP, "./cmd/epp")
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration:", err)
		os.Exit(1)
	}
	eppBinary = bins[0]
	code := m.Run()
	cleanup()
	os.Exit(code)
}
