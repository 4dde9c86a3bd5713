package integration

import (
	"testing"

	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

// bins holds the endpoint picker (and the laneway CLI, the local gateway
// and the model-server simulator), built once by TestMain for every test
// (with the race detector when launch.RaceEnv asks, so that data races in
// the real binary under these workloads fail the suite).
var bins launch.Binaries

func TestMain(m *testing.M) {
	launch.BuildAndRun(m, &bins, "laneway-integration", launch.RaceFromEnv(), launch.CmdEpp, launch.CmdLaneway, launch.CmdGateway, launch.CmdModelsim)
}
