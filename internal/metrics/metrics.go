package metrics

import (
	"sync"

	"github.com/laneway-dev/laneway/pkg/sched"
	"github.com/prometheus/client_golang/prometheus"
)

// WorkerType is the worker_type label of the reference router's series. An
// endpoint picker routes to aggregated (prefill and decode) model servers.
const WorkerType = "aggregated"

// Snapshotter is where the collector reads queue and endpoint state.
type Snapshotter interface {
	Snapshot() (sched.Snapshot, bool)
}

// Metrics holds every series the picker exposes. It is a dispatcher
// Observer and the stream observer of pkg/extproc.
type Metrics struct {
	model string

	backpressure *prometheus.CounterVec
	dispatches   *prometheus.CounterVec
	rejections   *prometheus.CounterVec
	queueWait    *prometheus.HistogramVec
	streams      *prometheus.CounterVec

	// Per-request updates go through cached children (see Children).
	direct, queued *Children[prometheus.Counter]  // dispatches by class
	waits          *Children[prometheus.Observer] // queueWait by class
	outcomes       *Children[prometheus.Counter]  // streams by outcome

	mu     sync.Mutex
	source Snapshotter
}

// New registers the picker's series on reg. model is the model label of
// the reference router's series (the pool's served model, or empty).
func New(reg prometheus.Registerer, model string) *Metrics {
	m := &Metrics{
		model: model,
		backpressure: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynamo_frontend_router_queue_backpressure_total",
			Help: "Requests refused by a policy-class queue, by reason.",
		}, []string{"model", "worker_type", "policy_class", "reason"}),
		dispatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "laneway_dispatches_total",
			Help: "Requests given an endpoint, by class and whether they waited in the queue.",
		}, []string{"policy_class", "queued"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "laneway_rejections_total",
			Help: "Requests answered without an endpoint, by class and reason.",
		}, []string{"policy_class", "reason"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "laneway_queue_wait_seconds",
			Help:    "Time queued requests waited before dispatch, by class.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"policy_class"}),
		streams: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "laneway_extproc_streams_total",
			Help: "ext_proc streams by outcome.",
		}, []string{"outcome"}),
	}
	m.direct = NewChildren(func(class string) prometheus.Counter { return m.dispatches.WithLabelValues(class, "false") })
	m.queued = NewChildren(func(class string) prometheus.Counter { return m.dispatches.WithLabelValues(class, "true") })
	m.waits = NewChildren(func(class string) prometheus.Observer { return m.queueWait.WithLabelValues(class) })
	m.outcomes = NewChildren(func(outcome string) prometheus.Counter { return m.streams.WithLabelValues(outcome) })
	reg.MustRegister(m.backpressure, m.dispatches, m.rejections, m.queueWait, m.streams, (*collector)(m))
	return m
}

// SetSource sets where queue gauges are read at scrape time.
func (m *Metrics) SetSource(s Snapshotter) {
	m.mu.Lock()
	m.source = s
	m.mu.Unlock()
}

// Decided counts one decision of the scheduling core (a dispatcher
// Observer): a dispatch by class and whether it waited, with its wait, or
// a rejection by class and reason (every reason but cancelled is the
// reference router's backpressure too).
func (m *Metrics) Decided(l *sched.Leave) {
	switch {
	case l.Grant == nil:
		m.rejections.WithLabelValues(l.Class, l.Reason).Inc()
		if l.Reason != sched.ReasonCancelled {
			m.backpressure.WithLabelValues(m.model, WorkerType, l.Class, l.Reason).Inc()
		}
	case !l.Queued:
		m.direct.Get(l.Class).Inc()
	default:
		m.queued.Get(l.Class).Inc()
		m.waits.Get(l.Class).Observe(l.Wait.Seconds())
	}
}

// HeldBytes is what RegisterHeldBytes reads: the ext_proc server's
// held-bytes budget and its open streams.
type HeldBytes interface {
	HeldBodyBytes() int64
	HeldHeaderBytes() int64
	MaxHeldBodyBytes() int64
	OpenStreams() int64
}

// RegisterHeldBytes registers the held-bytes gauges, read from h at
// scrape time: laneway_held_body_bytes, laneway_held_header_bytes,
// laneway_held_body_bytes_limit and laneway_extproc_streams_open.
func RegisterHeldBytes(reg prometheus.Registerer, h HeldBytes) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "laneway_held_body_bytes",
			Help: "Request body bytes held by requests whose body has not been passed back to the gateway yet (their buffers: what arrived, and at most 64 KiB or as much again beyond it), and on an HA follower the copies of forwarded streams the leader has not answered.",
		}, func() float64 { return float64(h.HeldBodyBytes()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "laneway_held_header_bytes",
			Help: "Request header bytes held by the open ext_proc streams; they count against laneway_held_body_bytes_limit with the bodies.",
		}, func() float64 { return float64(h.HeldHeaderBytes()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "laneway_held_body_bytes_limit",
			Help: "The budget of laneway_held_body_bytes and laneway_held_header_bytes together (--max-held-body-bytes); a request that would pass it gets 429 held_bytes.",
		}, func() float64 { return float64(h.MaxHeldBodyBytes()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "laneway_extproc_streams_open",
			Help: "ext_proc streams open on this replica's handler; past --max-streams one more gets 429 stream_limit.",
		}, func() float64 { return float64(h.OpenStreams()) }),
	)
}

// StreamDone counts one ext_proc stream by outcome.
func (m *Metrics) StreamDone(outcome string) {
	m.outcomes.Get(outcome).Inc()
}

var (
	pendingReqDesc = prometheus.NewDesc("dynamo_frontend_router_queue_pending_requests",
		"Requests waiting in a policy-class queue.", []string{"model", "worker_type", "policy_class"}, nil)
	pendingISLDesc = prometheus.NewDesc("dynamo_frontend_router_queue_pending_isl_tokens",
		"Raw prompt tokens of the requests waiting in a policy-class queue.", []string{"model", "worker_type", "policy_class"}, nil)
	pendingCachedDesc = prometheus.NewDesc("dynamo_frontend_router_queue_pending_cached_tokens",
		"Prefix-cached prompt tokens of the requests waiting in a policy-class queue.", []string{"model", "worker_type", "policy_class"}, nil)
	tenantsDesc = prometheus.NewDesc("laneway_tenants_active",
		"Tenants with requests queued in a policy class.", []string{"policy_class"}, nil)
	deficitDesc = prometheus.NewDesc("laneway_class_deficit_tokens",
		"DRR credit a policy class has earned and not spent, in uncached tokens.", []string{"policy_class"}, nil)
	activePrefillDesc = prometheus.NewDesc("laneway_endpoint_active_prefill_tokens",
		"Prompt tokens this picker sent to an endpoint that have not yet produced a first response byte.", []string{"endpoint"}, nil)
	inFlightDesc = prometheus.NewDesc("laneway_endpoint_in_flight_requests",
		"Requests this picker sent to an endpoint that have not finished.", []string{"endpoint"}, nil)
	autoThresholdDesc = prometheus.NewDesc("laneway_endpoint_prefill_busy_threshold_tokens",
		"The auto prefill busy threshold in force at an endpoint (classes with prefill_busy_threshold auto); absent when no class has one.", []string{"endpoint"}, nil)
	expectedOutputDesc = prometheus.NewDesc("laneway_endpoint_expected_output_tokens",
		"The output per request the auto threshold expects at an endpoint: what the requests asked for, or the engine's own mean once lower; 0 when it predicts nothing. Absent when no class has an auto threshold.", []string{"endpoint"}, nil)
)

// collector reads the dispatcher snapshot at scrape time.
type collector Metrics

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{pendingReqDesc, pendingISLDesc, pendingCachedDesc, deficitDesc, tenantsDesc, activePrefillDesc, inFlightDesc, autoThresholdDesc, expectedOutputDesc} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	src := c.source
	c.mu.Unlock()
	if src == nil {
		return
	}
	s, ok := src.Snapshot()
	if !ok {
		return
	}
	for _, cl := range s.Classes {
		ch <- prometheus.MustNewConstMetric(pendingReqDesc, prometheus.GaugeValue, float64(cl.Pending), c.model, WorkerType, cl.Name)
		ch <- prometheus.MustNewConstMetric(pendingISLDesc, prometheus.GaugeValue, float64(cl.PendingRawISL), c.model, WorkerType, cl.Name)
		ch <- prometheus.MustNewConstMetric(pendingCachedDesc, prometheus.GaugeValue, float64(cl.PendingCached), c.model, WorkerType, cl.Name)
		ch <- prometheus.MustNewConstMetric(deficitDesc, prometheus.GaugeValue, float64(cl.Deficit), cl.Name)
		ch <- prometheus.MustNewConstMetric(tenantsDesc, prometheus.GaugeValue, float64(cl.Tenants), cl.Name)
	}
	for _, e := range s.Endpoints {
		ch <- prometheus.MustNewConstMetric(activePrefillDesc, prometheus.GaugeValue, float64(e.ActivePrefill), e.Addr)
		ch <- prometheus.MustNewConstMetric(inFlightDesc, prometheus.GaugeValue, float64(e.InFlight), e.Addr)
		if e.HasAuto {
			ch <- prometheus.MustNewConstMetric(autoThresholdDesc, prometheus.GaugeValue, float64(e.AutoThreshold), e.Addr)
			ch <- prometheus.MustNewConstMetric(expectedOutputDesc, prometheus.GaugeValue, float64(e.ExpectedOutput), e.Addr)
		}
	}
}
