package launch

import (
	"context"
	"errors"
	"time"
)

// TB is the part of testing.TB the launcher's test helpers use. It is an
// interface of its own so that the package does not import testing: the
// demo and the load tool link it into commands.
type TB interface {
	Helper()
	Cleanup(func())
	Failed() bool
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
	Skipf(format string, args ...any)
}

// EventTimeout bounds WaitFor and the other waits of a test for a state
// that should come much sooner: a failure guard, not a performance
// assertion.
const EventTimeout = 30 * time.Second

// errNotYet is the check error of a condition that does not hold yet.
var errNotYet = errors.New("condition not met yet")

// WaitFor polls cond until it returns true, for a state that raises no
// event (a metric, a count), and fails t after EventTimeout. what describes
// the awaited state; it is called only for the failure message, after the
// last call of cond, so it can name what cond saw last.
func WaitFor(t TB, what func() string, cond func() bool) {
	t.Helper()
	WaitWithin(t, EventTimeout, what, cond)
}

// Receive waits for a value on ch, an event another goroutine delivers
// (an answer, a decision), and fails t after EventTimeout: a receive that
// cannot hang a suite until go test's own timeout. what describes the
// awaited value for the failure message.
func Receive[T any](t TB, ch <-chan T, what string) T {
	t.Helper()
	return receiveWithin(t, EventTimeout, ch, what)
}

func receiveWithin[T any](t TB, limit time.Duration, ch <-chan T, what string) T {
	t.Helper()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("timed out after %s: %s", limit, what)
		var zero T
		return zero
	}
}

// WaitWithin is WaitFor with its own bound, for a wait whose bound is what
// the test asserts (an endpoint change followed within a second). A
// condition that holds at the first check passes even when limit is not
// positive.
func WaitWithin(t TB, limit time.Duration, what func() string, cond func() bool) {
	t.Helper()
	err := Poll(context.Background(), nil, "", limit, func(context.Context) error {
		if cond() {
			return nil
		}
		return errNotYet
	})
	if err != nil {
		t.Fatalf("timed out after %s: %s", limit, what())
	}
}
