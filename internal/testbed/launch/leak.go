package launch

import (
	"context"
	"time"

	"go.uber.org/goleak"
)

// leakGrace is how long goroutines of a test may take to end after its
// cleanups (connections closing, servers returning): what outlives that
// has leaked.
const leakGrace = 10 * time.Second

// CheckGoroutines fails t when a goroutine started during the test is
// still running after its cleanups (go.uber.org/goleak, against the
// goroutines that ran when it was called). Call it first in the test so
// that its cleanup runs last.
func CheckGoroutines(t TB) {
	t.Helper()
	checkGoroutines(t, leakGrace)
}

func checkGoroutines(t TB, grace time.Duration) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		err := Poll(context.Background(), nil, "no goroutine of the test left", grace, func(context.Context) error {
			return goleak.Find(before)
		})
		if err != nil {
			t.Errorf("goroutines left after the test: %v", err)
		}
	})
}
