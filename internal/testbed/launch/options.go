package launch

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"time"
)

// Defaults of ProcOptions.
const (
	// DefaultLogLimit is the head of a process's output kept in memory:
	// start-up and the first errors explain most failures.
	DefaultLogLimit = 4 << 20
	// DefaultReadyTimeout bounds a start: the process serving and ready.
	DefaultReadyTimeout = 30 * time.Second
	// DefaultStopGrace is how long the cleanup of a Run* start waits for
	// the exit after SIGTERM before the goroutine dump (SIGQUIT).
	DefaultStopGrace = 20 * time.Second
)

// logShown is how much of a process's log a failed test prints: the end,
// where a goroutine dump or the last errors are.
const logShown = 64 << 10

// ProcOptions are what every start takes besides its command's flags.
type ProcOptions struct {
	// Name names the process in errors and logs; empty is the command's
	// name.
	Name string
	// Env is the whole environment; nil inherits this process's.
	Env []string
	// LogLimit bounds the output kept in memory; 0 is DefaultLogLimit.
	LogLimit int
	// Output, when set, also receives all of the output (a log file).
	Output io.Writer
	// ReadyTimeout bounds the start; 0 is DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// StopGrace is the drain a Run* start's cleanup allows after SIGTERM;
	// 0 is DefaultStopGrace.
	StopGrace time.Duration
}

func (o ProcOptions) readyTimeout() time.Duration { return cmp.Or(o.ReadyTimeout, DefaultReadyTimeout) }

func (o ProcOptions) stopGrace() time.Duration { return cmp.Or(o.StopGrace, DefaultStopGrace) }

// start starts bin with args, named o.Name or else name.
func (o ProcOptions) start(name, bin string, args []string) (*Proc, error) {
	return Start(Options{
		Name:     cmp.Or(o.Name, name),
		Bin:      bin,
		Args:     args,
		Env:      o.Env,
		LogLimit: cmp.Or(o.LogLimit, DefaultLogLimit),
		Output:   o.Output,
	})
}

// watch makes t's cleanup stop p and judge its exit: SIGTERM, and exit 0
// within grace, unless the test killed it or expects a failure (then it is
// only reaped). After a failed test it ends p with SIGQUIT instead, without
// waiting out a drain: the goroutine dump shows where a stuck process was.
// Either failure puts the end of p's log into the test log.
func watch(t TB, p *Proc, grace time.Duration) {
	t.Cleanup(func() {
		if t.Failed() {
			p.Quit()
			t.Logf("%s log (ended with SIGQUIT for its goroutine dump):\n%s", p.Name, p.Log.Tail(logShown))
			return
		}
		err := p.Stop(grace)
		var exit *exec.ExitError
		if p.failureOK.Load() && errors.As(err, &exit) {
			err = nil
		}
		if err != nil {
			t.Errorf("%s shutdown: %v", p.Name, err)
			t.Logf("%s log:\n%s", p.Name, p.Log.Tail(logShown))
		}
	})
}

// AwaitLine waits up to timeout for p to log a line containing substr and
// returns it: an event, not a poll. It fails when p exits first or ctx
// ends.
func (p *Proc) AwaitLine(ctx context.Context, substr string, timeout time.Duration) (string, error) {
	ch := p.Log.Await(substr)
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case l := <-ch:
		return l, nil
	case <-p.Done():
		// Exec's copying goroutine has written all of the output before
		// the process counts as exited: a line logged last is there.
		select {
		case l := <-ch:
			return l, nil
		default:
		}
		return "", fmt.Errorf("%s exited before logging %q: %w", p.Name, substr, p.Exited())
	case <-ctx.Done():
		return "", fmt.Errorf("%s: waiting for %q: %w", p.Name, substr, ctx.Err())
	case <-timer.C:
		return "", fmt.Errorf("%s logged no %q within %s\n%s", p.Name, substr, timeout, p.Log.Tail(4000))
	}
}

// WaitLog is AwaitLine for a test: it fails t unless p logs a line
// containing substr within EventTimeout.
func (p *Proc) WaitLog(t TB, substr string) string {
	t.Helper()
	l, err := p.AwaitLine(context.Background(), substr, EventTimeout)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return l
}

// awaitFields waits for p's JSON log line containing substr (the line a
// command logs once it listens, naming its addresses) and decodes it into
// v.
func awaitFields(ctx context.Context, p *Proc, substr string, timeout time.Duration, v any) error {
	l, err := p.AwaitLine(ctx, substr, timeout)
	if err != nil {
		return err
	}
	if err := json.Unmarshal([]byte(l), v); err != nil {
		return fmt.Errorf("%s: read the addresses from log line %q: %w", p.Name, l, err)
	}
	return nil
}
