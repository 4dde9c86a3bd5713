package status

import (
	"encoding/json"
	"math"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/laneway-dev/laneway/internal/dispatcher"
	"github.com/laneway-dev/laneway/pkg/policy"
)

// Path is where the status page is served on its own port (--status-port),
// never on the metrics port.
const Path = "/debug/status"

// TopN is how many tenants per class the page lists in each ranking.
const TopN = 10

// Page is the status page's JSON: what `laneway status` reads.
type Page struct {
	Time          time.Time `json:"time"`
	WindowSeconds int       `json:"window_seconds"`
	// Identity says in one line where tenant identity comes from.
	Identity  string           `json:"identity"`
	Queued    int              `json:"queued"`
	Classes   []ClassStatus    `json:"classes"`
	Endpoints []EndpointStatus `json:"endpoints"`
}

// ClassStatus is one policy class: its queue now and its last minute.
type ClassStatus struct {
	Name                string `json:"name"`
	Pending             uint64 `json:"pending"`
	PendingRawISLTokens uint64 `json:"pending_raw_isl_tokens"`
	PendingCachedTokens uint64 `json:"pending_cached_tokens"`
	Deficit             uint64 `json:"deficit"`
	TenantsActive       int    `json:"tenants_active"`
	// The last minute.
	Dispatched          uint64  `json:"dispatched"`
	Rejected            uint64  `json:"rejected"`
	QueueWaitP50Seconds float64 `json:"queue_wait_p50_seconds"`
	QueueWaitP99Seconds float64 `json:"queue_wait_p99_seconds"`
	// JainIndex is over the tenants that were backlogged in the window
	// (null with fewer than two).
	JainIndex         *float64       `json:"jain_index"`
	BackloggedTenants int            `json:"backlogged_tenants"`
	TopQueued         []TenantQueued `json:"top_queued"`
	TopServed         []TenantServed `json:"top_served"`
}

// TenantQueued is a tenant's queue in a class now.
type TenantQueued struct {
	Tenant              string `json:"tenant"`
	Pending             uint64 `json:"pending"`
	PendingRawISLTokens uint64 `json:"pending_raw_isl_tokens"`
}

// TenantServed is what a tenant was served in a class in the window.
type TenantServed struct {
	Tenant         string `json:"tenant"`
	UncachedTokens uint64 `json:"uncached_tokens"`
}

// EndpointStatus is one endpoint's load as this picker sees it.
type EndpointStatus struct {
	Addr                string `json:"addr"`
	ActivePrefillTokens uint64 `json:"active_prefill_tokens"`
	InFlight            int    `json:"in_flight"`
	Busy                bool   `json:"busy"`
	Stale               bool   `json:"stale"`
	Tainted             bool   `json:"tainted"`
	EngineWaiting       int    `json:"engine_waiting"`
	UnseenWaiting       int    `json:"unseen_waiting"`
	MaxBatchedTokens    uint64 `json:"max_batched_tokens"`
	// AwaitingEngine is grants whose stream ended before a first byte and
	// whose prefill the engine has not confirmed; OthersOnTheirWayTokens
	// the prompt tokens the busy test counts for other replicas' requests
	// on their way there, beside them; ArrivalShare the part of the
	// engine's arrivals taken for this picker's grants; PrefillRate the
	// rate learned from the engine's prompt-token counter (tokens/s, 0
	// unknown).
	AwaitingEngine         int     `json:"awaiting_engine"`
	OthersOnTheirWayTokens uint64  `json:"others_on_their_way_tokens"`
	ArrivalShare           float64 `json:"arrival_share"`
	PrefillRate            float64 `json:"prefill_rate_tokens_per_second"`
	// AutoThreshold is the endpoint's auto prefill busy threshold in
	// tokens; absent (0) when no class of the policy has one.
	AutoThreshold uint64 `json:"auto_threshold_tokens,omitempty"`
}

// Source is the dispatcher as the page reads it.
type Source interface {
	Status(topN int) (dispatcher.Status, bool)
	Identity() *policy.Identity
}

// Build assembles the page from the dispatcher's state and the tracker's
// window; ok is false when the dispatcher has stopped.
func Build(src Source, t *Tracker) (Page, bool) {
	st, ok := src.Status(TopN)
	if !ok {
		return Page{}, false
	}
	p := Page{Time: t.now().UTC(), WindowSeconds: windowSecs, Identity: src.Identity().String(), Queued: st.Queued,
		Classes: []ClassStatus{}, Endpoints: []EndpointStatus{}}
	for i, c := range st.Classes {
		w := t.Class(c.Name)
		cs := ClassStatus{
			Name: c.Name, Pending: c.Pending, PendingRawISLTokens: c.PendingRawISL, PendingCachedTokens: c.PendingCached,
			Deficit: c.Deficit, TenantsActive: c.Tenants,
			Dispatched: w.Dispatched, Rejected: w.Rejected,
			QueueWaitP50Seconds: w.WaitP50.Seconds(), QueueWaitP99Seconds: w.WaitP99.Seconds(),
			BackloggedTenants: w.Backlogged, TopQueued: []TenantQueued{}, TopServed: []TenantServed{},
		}
		if !math.IsNaN(w.Jain) {
			j := w.Jain
			cs.JainIndex = &j
		}
		for _, tq := range st.TopTenants[i] {
			cs.TopQueued = append(cs.TopQueued, TenantQueued{Tenant: tq.Name, Pending: tq.Pending, PendingRawISLTokens: tq.PendingRawISL})
		}
		for _, ts := range w.Served[:min(len(w.Served), TopN)] {
			cs.TopServed = append(cs.TopServed, TenantServed{Tenant: ts.Tenant, UncachedTokens: ts.Tokens})
		}
		p.Classes = append(p.Classes, cs)
	}
	for _, e := range st.Endpoints {
		p.Endpoints = append(p.Endpoints, EndpointStatus{
			Addr: e.Addr, ActivePrefillTokens: e.ActivePrefill, InFlight: e.InFlight, Busy: e.Busy, Stale: e.Stale,
			Tainted: e.Tainted, EngineWaiting: e.EngineWaiting, UnseenWaiting: e.UnseenWaiting, MaxBatchedTokens: e.MaxBatchedTokens,
			AwaitingEngine: e.AwaitingEngine, OthersOnTheirWayTokens: e.OthersOnTheirWay, ArrivalShare: e.ArrivalShare, PrefillRate: e.PrefillRate, AutoThreshold: e.AutoThreshold,
		})
	}
	return p, true
}

// Handler serves the page as JSON.
func Handler(src Source, t *Tracker) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := Build(src, t)
		if !ok {
			http.Error(w, "endpoint picker is shutting down", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(p) // a client that went away is not our error
	})
}

var jainDesc = prometheus.NewDesc("laneway_tenant_fairness_jain",
	"Jain's fairness index over the weight-normalised uncached tokens served, in the last minute, to the tenants of a policy class that were backlogged (reported when at least two were).",
	[]string{"policy_class"}, nil)

// Collector exports the tracker's per-class fairness index.
type Collector struct{ T *Tracker }

// Describe implements prometheus.Collector.
func (c Collector) Describe(ch chan<- *prometheus.Desc) { ch <- jainDesc }

// Collect implements prometheus.Collector.
func (c Collector) Collect(ch chan<- prometheus.Metric) {
	for _, name := range c.T.Classes() {
		if j := c.T.Class(name).Jain; !math.IsNaN(j) {
			ch <- prometheus.MustNewConstMetric(jainDesc, prometheus.GaugeValue, j, name)
		}
	}
}
