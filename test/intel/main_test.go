package intel

import (
	"fmt"
	"os"
	"testing"

	"github.com/laneway-dev/laneway/internal/launch"
)

// bins holds the picker, the simulator and the gateway, built once by
// TestMain.
var bins launch.Binaries

func TestMain(m *testing.M) {
	b, cleanup, err := launch.BuildTemp("laneway-intel-", false, launch.CmdEpp, launch.CmdModelsim, launch.CmdGateway)
	if err != nil {
		fmt.Fprintln(os.Stderr, "intel:", err)
		os.Exit(1)
	}
	bins = b
	code := m.Run()
	cleanup()
	os.Exit(code)
}
