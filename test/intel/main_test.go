package intel

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// Binaries built once by TestMain.
var eppBinary, simBinary string

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "laneway-intel-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "intel: temp dir:", err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		for _, b := range []struct {
			pkg string
			out *string
		}{{"./cmd/epp", &eppBinary}, {"./cmd/modelsim", &simBinary}} {
			bin, err := build(dir, b.pkg)
			if err != nil {
				fmt.Fprintln(os.Stderr, "intel:", err)
				return 1
			}
			*b.out = bin
		}
		return m.Run()
	}()
	os.Exit(code)
}

// build compiles a main package of this module into dir.
func build(dir, pkg string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command(goBin, "build", "-o", out, pkg)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s in %s: %w\n%s", pkg, root, err, b)
	}
	return out, nil
}

// moduleRoot walks up from the working directory to the folder of go.mod.
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
