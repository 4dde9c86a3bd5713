package intel

import (
	"testing"

	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

// bins holds the picker, the simulator, the gateway and the operator CLI,
// built once by TestMain.
var bins launch.Binaries

func TestMain(m *testing.M) {
	launch.BuildAndRun(m, &bins, "laneway-intel", false, launch.CmdEpp, launch.CmdModelsim, launch.CmdGateway, launch.CmdLaneway)
}
