package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"

	"github.com/laneway-dev/laneway/internal/testbed/simulate"
	"github.com/laneway-dev/laneway/pkg/policy"
)

const usage = `usage:
  laneway validate FILE
  laneway convert FILE --pool NAME [--namespace NS]
  laneway status --epp HOST:PORT [--watch] [--output json]
  laneway simulate (--trace FILE | --generate SPEC) [--policy FILE|none|round-robin]... [--servers N] [--out DIR] [flags]
`

// Exit codes.
const (
	exitOK      = 0
	exitInvalid = 1
	exitUsage   = 2
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is main without the process: it returns the exit code, so tests can
// call it.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "validate":
		return runValidate(args[1:], stdout, stderr)
	case "convert":
		return runConvert(args[1:], stdout, stderr)
	case "status":
		return runStatus(args[1:], stdout, stderr)
	case "simulate":
		return runSimulate(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fmt.Fprintf(stderr, "laneway: unknown command %q\n%s", args[0], usage)
	return exitUsage
}

// newFlagSet makes a subcommand's flag set that reports errors to the
// caller instead of printing its own usage.
func newFlagSet(name string, stderr io.Writer) *pflag.FlagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {}
	return fs
}

// usageError prints what was wrong with a command line, then the usage.
func usageError(stderr io.Writer, cmd string, err error) {
	if err != nil {
		fmt.Fprintf(stderr, "laneway %s: %v\n", cmd, err)
	}
	fmt.Fprint(stderr, usage)
}

// load reads a policy file and prints its problems, one per line.
func load(path string, stderr io.Writer) (*policy.Config, int) {
	cfg, err := policy.LoadFile(path)
	if err == nil {
		return cfg, exitOK
	}
	var ps policy.Problems
	if errors.As(err, &ps) {
		fmt.Fprintf(stderr, "%s: %d problem(s):\n", path, len(ps))
		for _, p := range ps {
			fmt.Fprintln(stderr, p.Message)
		}
		return nil, exitInvalid
	}
	fmt.Fprintf(stderr, "laneway: %v\n", err)
	return nil, exitInvalid
}

func runValidate(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("validate", stderr)
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		usageError(stderr, "validate", err)
		return exitUsage
	}
	cfg, code := load(fs.Arg(0), stderr)
	if cfg == nil {
		return code
	}
	if err := cfg.Describe(stdout); err != nil { // a compile error is unreachable: LoadFile validated
		fmt.Fprintf(stderr, "laneway: %v\n", err)
		return exitInvalid
	}
	return exitOK
}

func runConvert(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("convert", stderr)
	pool := fs.String("pool", "", "name of the InferencePool the policy is for (required)")
	ns := fs.String("namespace", "", "namespace of the pool and the objects (default: none, kubectl's current namespace)")
	err := fs.Parse(args)
	if err == nil && fs.NArg() == 1 && *pool == "" {
		err = errors.New("--pool is required")
	}
	if err != nil || fs.NArg() != 1 {
		usageError(stderr, "convert", err)
		return exitUsage
	}
	cfg, code := load(fs.Arg(0), stderr)
	if cfg == nil {
		return code
	}
	prof, classes := policy.ToObjects(cfg, *pool, *ns)
	if prof == nil {
		fmt.Fprintln(stdout, "# No policy classes: every request goes to the synthetic class \"default\"; no objects are needed.")
		return exitOK
	}
	objs := []any{prof}
	for i := range classes {
		objs = append(objs, &classes[i])
	}
	for i, o := range objs {
		out, err := manifest(o)
		if err != nil {
			fmt.Fprintf(stderr, "laneway: %v\n", err)
			return exitInvalid
		}
		if i > 0 {
			fmt.Fprintln(stdout, "---")
		}
		fmt.Fprint(stdout, string(out))
	}
	return exitOK
}

// manifest renders an object as YAML without the fields a new object does
// not have (status, creationTimestamp).
func manifest(obj any) ([]byte, error) {
	raw, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("encode object: %w", err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("decode object: %w", err)
	}
	delete(m, "status")
	if md, ok := m["metadata"].(map[string]any); ok {
		delete(md, "creationTimestamp")
	}
	out, err := yaml.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("render object as YAML: %w", err)
	}
	return out, nil
}

func runSimulate(args []string, stdout, stderr io.Writer) int {
	cfg := simulate.DefaultConfig()
	fs := newFlagSet("simulate", stderr)
	cfg.AddFlags(fs)
	help := fs.BoolP("help", "h", false, "show the flags and the --generate grammar")
	err := fs.Parse(args)
	switch {
	case err != nil:
	case fs.NArg() > 0:
		err = fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case (cfg.Trace == "") == (cfg.Generate == ""):
		err = errors.New("give one of --trace FILE and --generate SPEC")
	}
	if *help {
		fmt.Fprintf(stdout, "usage: laneway simulate (--trace FILE | --generate SPEC) [flags]\n\nflags:\n%s\n%s\n", fs.FlagUsages(), simulate.GenerateGrammar)
		return exitOK
	}
	if err != nil {
		usageError(stderr, "simulate", err)
		return exitUsage
	}
	if err := simulate.Main(&cfg, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "laneway simulate: %v\n", err)
		return exitInvalid
	}
	return exitOK
}
