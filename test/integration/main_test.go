package integration

import (
	"fmt"
	"os"
	"testing"

	"github.com/laneway-dev/laneway/internal/launch"
)

// bins holds the endpoint picker, built once by TestMain for every test
// (with the race detector when launch.RaceEnv asks, so that data races in
// the real binary under these workloads fail the suite).
var bins launch.Binaries

func TestMain(m *testing.M) {
	b, cleanup, err := launch.BuildTemp("laneway-integration-", launch.RaceFromEnv(), launch.CmdEpp)
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration:", err)
		os.Exit(1)
	}
	bins = b
	code := m.Run()
	cleanup()
	os.Exit(code)
}
