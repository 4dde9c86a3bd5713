package testproc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// ModuleRoot returns the directory of the module's go.mod, found by walking
// up from the working directory (during go test, the package's folder).
func ModuleRoot() (string, error) {
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
			return "", errors.New("find module root: no go.mod above the working directory; run inside the repository")
		}
		dir = parent
	}
}

// GoTool is the go command: the one on PATH, else the one of the toolchain
// that built this binary (a test started by an IDE may lack PATH).
func GoTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// Build compiles the main package pkg of the module (a path relative to the
// module root, like "./cmd/epp") into dir, with the race detector when race
// is set, and returns the binary's path (dir/<last element of pkg>). Build
// once per test binary (TestMain): a build takes seconds.
func Build(dir, pkg string, race bool) (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, filepath.Base(pkg))
	args := []string{"build", "-o", out}
	if race {
		args = append(args, "-race")
	}
	cmd := exec.Command(GoTool(), append(args, pkg)...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s in %s (race %t): %w\n%s", pkg, root, race, err, b)
	}
	return out, nil
}

// BuildAll builds each package of pkgs into one fresh temporary directory
// and returns the binaries in the same order, and a function that removes
// the directory.
func BuildAll(prefix string, race bool, pkgs ...string) (bins []string, cleanup func(), err error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return nil, nil, fmt.Errorf("temp dir for %v: %w", pkgs, err)
	}
	cleanup = func() { os.RemoveAll(dir) }
	for _, pkg := range pkgs {
		bin, err := Build(dir, pkg, race)
		if err != nil {
			cleanup()
			return nil, nil, err
		}
		bins = append(bins, bin)
	}
	return bins, cleanup, nil
}
