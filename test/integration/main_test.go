package integration

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// eppBinary is the endpoint picker built once by TestMain for every test.
var eppBinary string

// raceEPP builds the picker with the race detector, so that data races in
// the real binary under these workloads fail the suite (the picker's log
// shows the report). It costs a slower build and picker; CI turns it on.
var raceEPP = flag.Bool("epp-race", os.Getenv("LANEWAY_EPP_RACE") == "1", "build the epp binary with -race")

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "laneway-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration: temp dir:", err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		bin, err := buildEPP(dir, *raceEPP)
		if err != nil {
			fmt.Fprintln(os.Stderr, "integration:", err)
			return 1
		}
		eppBinary = bin
		return m.Run()
	}()
	os.Exit(code)
}

// buildEPP compiles ./cmd/epp of this module into dir.
func buildEPP(dir string, race bool) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out := filepath.Join(dir, "epp")
	args := []string{"build", "-o", out}
	if race {
		args = append(args, "-race")
	}
	args = append(args, "./cmd/epp")
	cmd := exec.Command(goBin, args...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build ./cmd/epp in %s: %w\n%s", root, err, b)
	}
	return out, nil
}

// moduleRoot walks up from the working directory (the package's folder
// during go test) to the directory holding go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find module root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("find module root: no go.mod above the working directory")
		}
		dir = parent
	}
}
