package launch

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// GoTool returns the go command: the one on PATH, else $GOROOT/bin/go (a
// test started by an IDE may lack PATH but have GOROOT).
func GoTool() (string, error) {
	p, err := exec.LookPath("go")
	if err == nil {
		return p, nil
	}
	if root := os.Getenv("GOROOT"); root != "" {
		p := filepath.Join(root, "bin", "go")
		if _, serr := os.Stat(p); serr == nil {
			return p, nil
		}
		return "", fmt.Errorf("find the go command: not on PATH (%v), and not at $GOROOT/bin/go (GOROOT=%s)", err, root)
	}
	return "", fmt.Errorf("find the go command: not on PATH (%v) and GOROOT is not set", err)
}

// BuildPackage compiles the main package pkg (a path relative to the module
// root, like "./cmd/epp", or a module path of a dependency) into dir, with
// the race detector when race is set, and returns the binary's path
// (dir/<last element of pkg>). Build once per test binary (TestMain): a
// build takes seconds.
func BuildPackage(dir, pkg string, race bool) (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	gotool, err := GoTool()
	if err != nil {
		return "", fmt.Errorf("build %s: %w", pkg, err)
	}
	out := filepath.Join(dir, filepath.Base(pkg))
	args := []string{"build", "-o", out}
	if race {
		args = append(args, "-race")
	}
	cmd := exec.Command(gotool, append(args, pkg)...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s in %s (race %t): %w\n%s", pkg, root, race, err, b)
	}
	return out, nil
}

// The module's commands a run starts, by their names under cmd/.
const (
	CmdEpp      = "epp"
	CmdModelsim = "modelsim"
	CmdGateway  = "gateway"
	CmdLaneway  = "laneway"
)

// Binaries are the paths of the module's commands that the launcher
// starts; an empty path is a command not built. The Start* and Run*
// methods take the binary from here.
type Binaries struct {
	// Epp is cmd/epp, the endpoint picker.
	Epp string
	// Modelsim is cmd/modelsim, the model-server simulator.
	Modelsim string
	// Gateway is cmd/gateway, the local ext_proc gateway.
	Gateway string
	// Laneway is cmd/laneway, the operator CLI.
	Laneway string
}

// InDir returns the binaries called epp, modelsim, gateway and laneway in dir, as
// `go build -o dir/ ./cmd/...` leaves them.
func InDir(dir string) Binaries {
	return Binaries{
		Epp:      filepath.Join(dir, CmdEpp),
		Modelsim: filepath.Join(dir, CmdModelsim),
		Gateway:  filepath.Join(dir, CmdGateway),
		Laneway:  filepath.Join(dir, CmdLaneway),
	}
}

// Build builds the named commands (CmdEpp, CmdModelsim, CmdGateway,
// CmdLaneway) into
// dir. raceEPP builds the picker with the race detector, so that a data
// race in the binary under test fails the suite (its log shows the
// report); the helpers are built plain, which is faster.
func Build(dir string, raceEPP bool, cmds ...string) (Binaries, error) {
	var b Binaries
	for _, name := range cmds {
		var dst *string
		switch name {
		case CmdEpp:
			dst = &b.Epp
		case CmdModelsim:
			dst = &b.Modelsim
		case CmdGateway:
			dst = &b.Gateway
		case CmdLaneway:
			dst = &b.Laneway
		default:
			return Binaries{}, fmt.Errorf("build %q: not one of %s, %s, %s, %s", name, CmdEpp, CmdModelsim, CmdGateway, CmdLaneway)
		}
		bin, err := BuildPackage(dir, "./cmd/"+name, raceEPP && name == CmdEpp)
		if err != nil {
			return Binaries{}, err
		}
		*dst = bin
	}
	return b, nil
}

// BuildTemp is Build into a fresh temporary directory named after prefix;
// cleanup removes it.
func BuildTemp(prefix string, raceEPP bool, cmds ...string) (b Binaries, cleanup func(), err error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return Binaries{}, nil, fmt.Errorf("temp dir for %v: %w", cmds, err)
	}
	cleanup = func() { os.RemoveAll(dir) }
	if b, err = Build(dir, raceEPP, cmds...); err != nil {
		cleanup()
		return Binaries{}, nil, err
	}
	return b, cleanup, nil
}

// RaceEnv is the environment variable that asks the suites for a picker
// built with the race detector ("1"): slower, and it makes a data race in
// the real binary under the suites' workloads fail them.
const RaceEnv = "LANEWAY_EPP_RACE"

// RaceFromEnv reports whether RaceEnv asks for a race-detector picker.
func RaceFromEnv() bool { return os.Getenv(RaceEnv) == "1" }

// binary returns path, or an error naming the command when it was not
// built.
func binary(path, cmd string) (string, error) {
	if path == "" {
		return "", fmt.Errorf("%s: no binary (build it with launch.Build)", cmd)
	}
	return path, nil
}

// M is the part of *testing.M that BuildAndRun uses.
type M interface{ Run() int }

// BuildAndRun is a suite's TestMain: it builds cmds into a temporary
// folder named after suite (Build's raceEPP), sets *bins, runs the tests,
// removes the folder and exits with the tests' code. A failed build exits
// 1 before any test.
func BuildAndRun(m M, bins *Binaries, suite string, raceEPP bool, cmds ...string) {
	b, cleanup, err := BuildTemp(suite+"-", raceEPP, cmds...)
	if err != nil {
		fmt.Fprintln(os.Stderr, suite+":", err)
		os.Exit(1)
	}
	*bins = b
	code := m.Run()
	cleanup()
	os.Exit(code)
}
