package dispatcher

import (
	"github.com/laneway-dev/laneway/pkg/sched"
)

// Options configure a Dispatcher: the core's options plus the driver's.
type Options struct {
	sched.Options
	// Observers see every decision of the core, in this order.
	Observers []Observer
	// OnEndpoints, when set, is called with every endpoint set given to
	// SetEndpoints, on the caller's goroutine, after the loop has it (the
	// scraper starts and stops its targets here, in Kubernetes mode too).
	// It must not modify the slice.
	OnEndpoints func([]sched.Endpoint)
}

// Observer sees the core's decisions: one call per request that leaves
// it, granted (l.Grant set; l.Queued and l.Wait say whether and how long
// it waited) or answered with an error (l.Err, and l.Reason its metrics
// reason: queue_limit_requests, queue_limit_raw_isl_tokens,
// queue_limit_cached_tokens, queue_limit_tenants, tenant_limit_requests,
// tenant_limit_raw_isl_tokens, shed, no_endpoints, shutting_down,
// cancelled). Decided runs on the loop goroutine, before the waiting
// Acquire is answered; it must not block, and must not keep l.
type Observer interface {
	Decided(l *sched.Leave)
}
