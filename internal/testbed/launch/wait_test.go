package launch

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestWaitWithin(t *testing.T) {
	tests := []struct {
		name     string
		limit    time.Duration
		trueFrom int32 // cond holds from this call on; 0: never
		wantFail bool
	}{
		{name: "holds at once", limit: time.Second, trueFrom: 1},
		{name: "holds at once with no time left", limit: 0, trueFrom: 1},
		{name: "holds after a few polls", limit: 10 * time.Second, trueFrom: 4},
		{name: "never holds", limit: 100 * time.Millisecond, wantFail: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int32
			start := time.Now()
			f := runFake(func(tb *fakeTB) {
				WaitWithin(tb, tc.limit, func() string { return fmt.Sprintf("calls = %d", calls.Load()) }, func() bool {
					n := calls.Add(1)
					return tc.trueFrom > 0 && n >= tc.trueFrom
				})
			})
			if f.failed != tc.wantFail {
				t.Fatalf("failed = %v (%q), want %v", f.failed, f.errors, tc.wantFail)
			}
			if !tc.wantFail {
				if got := calls.Load(); got != tc.trueFrom {
					t.Errorf("cond called %d times, want %d (no call after it held)", got, tc.trueFrom)
				}
				return
			}
			// The message says what was awaited and what was seen last, and
			// the wait gave up at its bound, not long after.
			if len(f.errors) != 1 || !strings.Contains(f.errors[0], "timed out after 100ms: calls = ") {
				t.Errorf("errors %q, want one naming the bound and the state seen", f.errors)
			}
			if took := time.Since(start); took < tc.limit || took > tc.limit+5*time.Second {
				t.Errorf("gave up after %v, want about %v", took, tc.limit)
			}
		})
	}
}

// TestReceive: a value that comes is returned; one that does not fails the
// test at the bound, naming what was awaited.
func TestReceive(t *testing.T) {
	ch := make(chan int, 1)
	ch <- 7
	f := runFake(func(tb *fakeTB) {
		if got := receiveWithin(tb, time.Second, ch, "seven"); got != 7 {
			tb.Errorf("received %d, want 7", got)
		}
	})
	if f.failed {
		t.Fatalf("a delivered value failed: %q", f.errors)
	}
	f = runFake(func(tb *fakeTB) { receiveWithin(tb, 50*time.Millisecond, ch, "an answer that never comes") })
	if !f.failed || len(f.errors) != 1 || !strings.Contains(f.errors[0], "timed out after 50ms: an answer that never comes") {
		t.Errorf("failed %v, errors %q; want one naming the bound and what was awaited", f.failed, f.errors)
	}
}

func TestCheckGoroutines(t *testing.T) {
	t.Run("none left", func(t *testing.T) {
		f := runFake(func(tb *fakeTB) {
			CheckGoroutines(tb)
			done := make(chan struct{})
			go func() { close(done) }()
			<-done
		})
		if f.failed {
			t.Fatalf("failed: %q", f.errors)
		}
	})
	t.Run("ends within the grace", func(t *testing.T) {
		stop := make(chan struct{})
		f := runFake(func(tb *fakeTB) {
			CheckGoroutines(tb)
			go func() { <-stop }()
			tb.Cleanup(func() { time.AfterFunc(200*time.Millisecond, func() { close(stop) }) })
		})
		if f.failed {
			t.Fatalf("failed: %q", f.errors)
		}
	})
	t.Run("leaked", func(t *testing.T) {
		stop := make(chan struct{})
		defer close(stop)
		f := runFake(func(tb *fakeTB) {
			checkGoroutines(tb, 300*time.Millisecond)
			go leakUntil(stop)
		})
		if !f.failed || len(f.errors) != 1 || !strings.Contains(f.errors[0], "leakUntil") {
			t.Fatalf("errors %q, want one naming the leaked goroutine's function", f.errors)
		}
	})
}

// leakUntil is the goroutine TestCheckGoroutines leaks; its name must show
// in the report.
func leakUntil(stop <-chan struct{}) { <-stop }

// TestWatch: the cleanup of a Run* start judges the exit: a clean exit on
// SIGTERM passes, a failing one fails the test, unless the test killed the
// process or said it expects the failure.
func TestWatch(t *testing.T) {
	tests := []struct {
		mode      string
		prepare   func(p *Proc)
		wantError string
	}{
		{mode: "term0"},
		{mode: "exit3", wantError: "shutdown"},
		{mode: "exit3", prepare: (*Proc).ExpectFailure},
		{mode: "term0", prepare: (*Proc).Kill},
		{mode: "stuck", wantError: "did not exit"},
	}
	for _, tc := range tests {
		t.Run(tc.mode, func(t *testing.T) {
			p := startChild(t, tc.mode)
			if _, err := p.AwaitLine(context.Background(), "child ", time.Minute); err != nil {
				t.Fatal(err)
			}
			f := runFake(func(tb *fakeTB) {
				// A race-detector binary sleeps 1 s at exit (the detector's
				// atexit delay): only the stuck child is meant to outlast it.
				grace := 10 * time.Second
				if tc.mode == "stuck" {
					grace = time.Second
				}
				watch(tb, p, grace)
				if tc.prepare != nil {
					tc.prepare(p)
				}
			})
			got := strings.Join(f.errors, "\n")
			if (tc.wantError == "") != (got == "") || !strings.Contains(got, tc.wantError) {
				t.Fatalf("errors %q, want one containing %q; log:\n%s", got, tc.wantError, p.Log)
			}
			if tc.wantError != "" && len(f.logs) == 0 {
				t.Error("the failed shutdown put no log into the test log")
			}
			if p.Exited() == nil {
				t.Error("process still running after the cleanup")
			}
		})
	}
	t.Run("failed test", func(t *testing.T) {
		p := startChild(t, "stuck")
		if _, err := p.AwaitLine(context.Background(), "child ", time.Minute); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		f := runFake(func(tb *fakeTB) {
			watch(tb, p, time.Minute)
			tb.Errorf("the test failed")
		})
		// No drain is waited out: SIGQUIT at once, and its dump is logged.
		if took := time.Since(start); took > 30*time.Second {
			t.Errorf("cleanup took %v", took)
		}
		if len(f.logs) != 1 || !strings.Contains(f.logs[0], "goroutine ") {
			t.Errorf("logs %q, want the goroutine dump", f.logs)
		}
	})
}

func TestAwaitLine(t *testing.T) {
	p := startChild(t, "exit3")
	l, err := p.AwaitLine(context.Background(), "failing", time.Minute)
	if err != nil || l != "child failing" {
		t.Fatalf("AwaitLine = %q, %v; want the child's line", l, err)
	}
	<-p.Done()
	if _, err := p.AwaitLine(context.Background(), "never printed", time.Minute); err == nil || !strings.Contains(err.Error(), "exited") {
		t.Fatalf("AwaitLine after the exit = %v, want the exit reported", err)
	}
	var ee *exec.ExitError
	if err := p.ExitErr(); !errors.As(err, &ee) {
		t.Fatalf("ExitErr = %v, want an exit status", err)
	}
}
