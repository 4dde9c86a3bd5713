package e2e

import (
	"os"

	"github.com/laneway-dev/laneway/internal/testproc"
)

// proc is a child process whose output is kept for failure messages.
type proc struct {
	*testproc.Proc
	out *testproc.Log
}

// maxLog is how much of a process's output is kept: its head, since the
// start-up and first errors are what explain a failure.
const maxLog = 4 << 20

// startProc starts bin with args and env added to the test's environment.
func startProc(name, bin string, args, env []string) (*proc, error) {
	p, err := testproc.Start(testproc.Options{Name: name, Bin: bin, Args: args, Env: append(os.Environ(), env...), LogLimit: maxLog})
	if err != nil {
		return nil, err
	}
	return &proc{Proc: p, out: p.Log}, nil
}

// tail is the last n bytes of a log.
func tail(s string, n int) string { return testproc.Tail(s, n) }
