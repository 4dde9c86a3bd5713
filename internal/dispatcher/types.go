package dispatcher

import (
	"time"

	"github.com/laneway-dev/laneway/pkg/sched"
)

// Options configure a Dispatcher: the core's options plus the driver's.
type Options struct {
	sched.Options
	// Observer receives per-request events; nil means none.
	Observer Observer
	// OnEndpoints, when set, is called with every endpoint set given to
	// SetEndpoints, on the caller's goroutine, after the loop has it (the
	// scraper starts and stops its targets here, in Kubernetes mode too).
	// It must not modify the slice.
	OnEndpoints func([]sched.Endpoint)
	// OnLeave, when set, sees every decision whole (tenant, tokens, wait)
	// on the loop goroutine, after the Observer; it must not block or keep
	// l.
	OnLeave func(l *sched.Leave)
}

// Observer receives the dispatcher's per-request events for metrics. Its
// methods run on the loop goroutine and must not block.
type Observer interface {
	// Dispatched: a request got an endpoint, after waiting wait in the
	// queue (0 and queued false for a direct dispatch).
	Dispatched(class string, queued bool, wait time.Duration)
	// Rejected: a request was answered with an error; reason is one of
	// queue_limit_requests, queue_limit_raw_isl_tokens,
	// queue_limit_cached_tokens, queue_limit_tenants,
	// tenant_limit_requests, tenant_limit_raw_isl_tokens, shed,
	// no_endpoints, shutting_down, cancelled.
	Rejected(class string, reason string)
}

type nopObserver struct{}

func (nopObserver) Dispatched(string, bool, time.Duration) {}
func (nopObserver) Rejected(string, string)                {}
