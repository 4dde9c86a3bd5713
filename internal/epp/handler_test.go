package epp

import (
	"errors"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/pkg/drr"
	"github.com/laneway-dev/laneway/pkg/extproc"
	"github.com/laneway-dev/laneway/pkg/sched"
)

// TestReplyRetryAfter: the 429s of a class carry its queue-wait estimate;
// answers without a class leave retry-after to the server's default (0).
func TestReplyRetryAfter(t *testing.T) {
	h := &Handler{WaitEstimate: func(class string) time.Duration {
		if class == "busy" {
			return 3 * time.Second
		}
		return 0
	}}
	cases := []struct {
		name string
		err  error
		want time.Duration
	}{
		{"queue limit of a class with an estimate", &drr.Rejection{Class: "busy", Kind: drr.LimitRequests, Current: 8, Limit: 8}, 3 * time.Second},
		{"tenant limit", &drr.Rejection{Class: "busy", Tenant: "t", Kind: drr.LimitTenants, Current: 2, Limit: 2}, 3 * time.Second},
		{"queue limit of a class without one", &drr.Rejection{Class: "idle", Kind: drr.LimitRequests}, 0},
		{"shed", &sched.ShedError{Class: "busy", Waited: time.Second, Budget: time.Second}, 3 * time.Second},
		{"no endpoint", &sched.NoEndpointError{Filter: "x"}, 0},
		{"shutting down", sched.ErrShuttingDown, 0},
		{"other", errors.New("x"), 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var r *extproc.Reply
			if !errors.As(h.replyFor(tc.err), &r) {
				t.Fatalf("replyFor(%v) is no Reply", tc.err)
			}
			if r.RetryAfter != tc.want {
				t.Errorf("RetryAfter %s, want %s", r.RetryAfter, tc.want)
			}
		})
	}
}

// TestCachedEstimate: each class is read at most once per ttl.
func TestCachedEstimate(t *testing.T) {
	now := time.Unix(1000, 0)
	reads := map[string]int{}
	est := cachedEstimate(func(class string) time.Duration {
		reads[class]++
		return time.Duration(reads[class]) * time.Second
	}, time.Second, func() time.Time { return now })
	steps := []struct {
		advance time.Duration
		class   string
		want    time.Duration
	}{
		{0, "a", time.Second},
		{500 * time.Millisecond, "a", time.Second}, // cached
		{0, "b", time.Second},                      // its own entry
		{500 * time.Millisecond, "a", 2 * time.Second},
		{0, "b", time.Second},
	}
	for i, s := range steps {
		now = now.Add(s.advance)
		if got := est(s.class); got != s.want {
			t.Errorf("step %d (%s): %s, want %s", i, s.class, got, s.want)
		}
	}
}
