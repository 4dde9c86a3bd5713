package intel

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/laneway-dev/laneway/internal/testproc"
)

// Binaries built once by TestMain.
var eppBinary, simBinary string

func TestMain(m *testing.M) {
	flag.Parse()
	bins, cleanup, err := testproc.BuildAll("laneway-intel-", false, "./cmd/epp", "./cmd/modelsim")
	if err != nil {
		fmt.Fprintln(os.Stderr, "intel:", err)
		os.Exit(1)
	}
	eppBinary, simBinary = bins[0], bins[1]
	code := m.Run()
	cleanup()
	os.Exit(code)
}
