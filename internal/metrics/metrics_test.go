package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/laneway-dev/laneway/pkg/sched"
)

// TestPerRequestSeries: the per-request updates land on the series the
// labels name, whichever order classes and outcomes first appear in.
func TestPerRequestSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg, "llama")
	granted := &sched.Grant{}
	m.Decided(&sched.Leave{Grant: granted, Class: "premium"})
	m.Decided(&sched.Leave{Grant: granted, Class: "premium"})
	m.Decided(&sched.Leave{Grant: granted, Class: "premium", Queued: true, Wait: 3 * time.Millisecond})
	m.Decided(&sched.Leave{Grant: granted, Class: "regular", Queued: true, Wait: 40 * time.Millisecond})
	m.StreamDone("routed")
	m.StreamDone("routed")
	m.StreamDone("queue_limit")
	m.Decided(&sched.Leave{Class: "regular", Reason: "shed"})
	tests := []struct {
		name string
		c    prometheus.Collector
		want string
	}{
		{"dispatches", m.dispatches, `
# HELP laneway_dispatches_total Requests given an endpoint, by class and whether they waited in the queue.
# TYPE laneway_dispatches_total counter
laneway_dispatches_total{policy_class="premium",queued="false"} 2
laneway_dispatches_total{policy_class="premium",queued="true"} 1
laneway_dispatches_total{policy_class="regular",queued="true"} 1
`},
		{"streams", m.streams, `
# HELP laneway_extproc_streams_total ext_proc streams by outcome.
# TYPE laneway_extproc_streams_total counter
laneway_extproc_streams_total{outcome="queue_limit"} 1
laneway_extproc_streams_total{outcome="routed"} 2
`},
		{"backpressure", m.backpressure, `
# HELP dynamo_frontend_router_queue_backpressure_total Requests refused by a policy-class queue, by reason.
# TYPE dynamo_frontend_router_queue_backpressure_total counter
dynamo_frontend_router_queue_backpressure_total{model="llama",policy_class="regular",reason="shed",worker_type="aggregated"} 1
`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := testutil.CollectAndCompare(tc.c, strings.NewReader(tc.want)); err != nil {
				t.Error(err)
			}
		})
	}
	if n := testutil.CollectAndCount(m.queueWait); n != 2 {
		t.Errorf("queue wait histograms: %d, want one per class that queued (2)", n)
	}
	if got := testutil.ToFloat64(m.dispatches.WithLabelValues("premium", "true")); got != 1 {
		t.Errorf("premium queued = %v", got)
	}
}
