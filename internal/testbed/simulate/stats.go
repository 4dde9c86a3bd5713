package simulate

import (
	"math"
	"slices"
	"sort"

	"github.com/laneway-dev/laneway/internal/status"
)

// Percentiles are latency percentiles in milliseconds (nearest rank).
type Percentiles struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
}

// percentiles of ns values (sorted in place).
func percentiles(ns []int64) Percentiles {
	if len(ns) == 0 {
		return Percentiles{}
	}
	slices.Sort(ns)
	at := func(q float64) float64 {
		i := int(math.Ceil(q*float64(len(ns)))) - 1
		return float64(ns[max(i, 0)]) / 1e6
	}
	return Percentiles{P50: at(0.50), P90: at(0.90), P99: at(0.99)}
}

// ClassSummary is one class's (or the total's) figures in one run.
type ClassSummary struct {
	Class string `json:"class"`
	// Requests, and how they ended: completed (200), 429, 503.
	Requests       int `json:"requests"`
	Completed      int `json:"completed"`
	Rejected429    int `json:"rejected_429"`
	Unavailable503 int `json:"unavailable_503"`
	// Queued is how many waited in the picker's queue.
	Queued int `json:"queued"`
	// TTFT is arrival to first token, QueueWait arrival to dispatch
	// (0 for a direct grant), Latency arrival to last token; completed
	// requests only.
	TTFT      Percentiles `json:"ttft_ms"`
	QueueWait Percentiles `json:"queue_wait_ms"`
	Latency   Percentiles `json:"latency_ms"`
	// OutputTokens of completed requests; per second of the makespan.
	OutputTokens       int64   `json:"output_tokens"`
	OutputTokensPerSec float64 `json:"output_tokens_per_s"`
	// WindowUncached is the uncached prompt tokens (SPEC §1, the DRR
	// cost) dispatched in the contended window, and UncachedShare this
	// class's part of all classes' (Summary.WindowS says what the window
	// is).
	WindowUncached int64   `json:"window_uncached_tokens"`
	UncachedShare  float64 `json:"uncached_share"`
	// FirstN is how many of this class's requests are among the first N
	// completions of the run (PolicySummary.FirstN).
	FirstN int `json:"first_n"`
	// Tenants counts the tenants with requests; JainTenants is Jain's
	// fairness index over their window uncached tokens (null for fewer
	// than two tenants or none served in the window).
	Tenants     int      `json:"tenants"`
	JainTenants *float64 `json:"jain_tenants"`
}

// TenantSummary is one tenant's figures.
type TenantSummary struct {
	Tenant         string      `json:"tenant"`
	Requests       int         `json:"requests"`
	Completed      int         `json:"completed"`
	Rejected429    int         `json:"rejected_429"`
	WindowUncached int64       `json:"window_uncached_tokens"`
	TTFT           Percentiles `json:"ttft_ms"`
}

// SimFigures are the simulator's own costs for one run.
type SimFigures struct {
	WallS float64 `json:"wall_s"`
	// RequestsPerS is trace requests simulated per second of wall time.
	RequestsPerS float64 `json:"requests_per_s"`
	// CoreNsPerDecision is the wall time in the scheduling core (Admit,
	// Drain, Release, SetMetrics) per decision it returned.
	CoreNsPerDecision float64 `json:"core_ns_per_decision"`
	Decisions         int64   `json:"decisions"`
	Instants          int64   `json:"instants"`
}

// PolicySummary is one run's figures.
type PolicySummary struct {
	Policy   string `json:"policy"`
	Picker   string `json:"picker"`
	Baseline bool   `json:"baseline"`
	// Classes with at least one request, in the policy's order, then the
	// total over all of them.
	Classes []ClassSummary `json:"classes"`
	Total   ClassSummary   `json:"total"`
	// MakespanS is first arrival to last token.
	MakespanS float64 `json:"makespan_s"`
	// WindowS is the contended window's length: first to last arrival,
	// or for a trace released at one instant, to the FirstN-th completion.
	WindowS float64 `json:"window_s"`
	// FirstN is the number of completions the first_n counts look at:
	// half of the completions.
	FirstN int `json:"first_n"`
	// PrefixHitRate is the engines' cached prompt tokens over all prompt
	// tokens served.
	PrefixHitRate float64         `json:"prefix_hit_rate"`
	Tenants       []TenantSummary `json:"tenants,omitempty"`
	Sim           SimFigures      `json:"sim"`
}

// Summarize computes a run's figures.
func Summarize(t *Trace, res *Result) PolicySummary {
	out := res.Outcomes
	ps := PolicySummary{Policy: res.Policy.Name, Picker: res.Policy.Picker, Baseline: res.Policy.Baseline}
	t0 := t.Requests[t.byArrival[0]].Arrival
	lastArrival := t.Requests[t.byArrival[len(t.byArrival)-1]].Arrival
	// Completion order.
	var done []int32
	lastEnd := t0
	for i := range out {
		if out[i].Status == 200 {
			done = append(done, int32(i))
			lastEnd = max(lastEnd, out[i].End)
		}
	}
	sort.SliceStable(done, func(a, b int) bool { return out[done[a]].End < out[done[b]].End })
	ps.FirstN = len(done) / 2
	makespan := float64(lastEnd-t0) / 1e9
	ps.MakespanS = makespan
	window := lastArrival
	if window == t0 && ps.FirstN > 0 {
		window = out[done[ps.FirstN-1]].End
	}
	ps.WindowS = float64(window-t0) / 1e9
	inFirstN := make([]bool, len(out))
	for _, i := range done[:ps.FirstN] {
		inFirstN[i] = true
	}

	type acc struct {
		ClassSummary
		ttft, wait, lat []int64
		tenants         map[string]int64
	}
	classes := make([]*acc, len(res.Classes)+1) // the last is the total
	for i := range classes {
		name := "total"
		if i < len(res.Classes) {
			name = res.Classes[i]
		}
		classes[i] = &acc{ClassSummary: ClassSummary{Class: name}, tenants: map[string]int64{}}
	}
	tenants := map[string]*TenantSummary{}
	tenantTTFT := map[string][]int64{}
	var prompt, cached int64
	for i := range out {
		o := &out[i]
		q := &t.Requests[i]
		uncached := int64(q.PromptTokens) - int64(min(int(o.Cached), q.PromptTokens))
		inWindow := o.Server >= 0 && o.Leave <= window
		var ts *TenantSummary
		if q.Tenant != "" {
			if ts = tenants[q.Tenant]; ts == nil {
				ts = &TenantSummary{Tenant: q.Tenant}
				tenants[q.Tenant] = ts
			}
			ts.Requests++
		}
		for _, a := range []*acc{classes[o.Class], classes[len(classes)-1]} {
			a.Requests++
			if q.Tenant != "" {
				if _, ok := a.tenants[q.Tenant]; !ok {
					a.tenants[q.Tenant] = 0
				}
			}
			if o.Queued {
				a.Queued++
			}
			if inWindow {
				a.WindowUncached += uncached
				if q.Tenant != "" {
					a.tenants[q.Tenant] += uncached
				}
			}
			switch o.Status {
			case 200:
				a.Completed++
				a.ttft = append(a.ttft, o.First-q.Arrival)
				a.wait = append(a.wait, o.Leave-q.Arrival)
				a.lat = append(a.lat, o.End-q.Arrival)
				a.OutputTokens += int64(q.OutputTokens)
				if inFirstN[i] {
					a.FirstN++
				}
			case 429:
				a.Rejected429++
			case 503:
				a.Unavailable503++
			}
		}
		if o.Status == 200 {
			prompt += int64(q.PromptTokens)
			cached += int64(o.EngineCached)
		}
		if ts != nil {
			switch o.Status {
			case 200:
				ts.Completed++
				tenantTTFT[q.Tenant] = append(tenantTTFT[q.Tenant], o.First-q.Arrival)
			case 429:
				ts.Rejected429++
			}
			if inWindow {
				ts.WindowUncached += uncached
			}
		}
	}
	total := classes[len(classes)-1]
	for i, a := range classes {
		a.TTFT, a.QueueWait, a.Latency = percentiles(a.ttft), percentiles(a.wait), percentiles(a.lat)
		if makespan > 0 {
			a.OutputTokensPerSec = float64(a.OutputTokens) / makespan
		}
		if total.WindowUncached > 0 {
			a.UncachedShare = float64(a.WindowUncached) / float64(total.WindowUncached)
		}
		a.Tenants = len(a.tenants)
		var xs []float64
		for _, v := range a.tenants {
			xs = append(xs, float64(v))
		}
		// The picker's own index (status.Jain): none for fewer than two
		// tenants or nothing served, where fairness says nothing.
		if j := status.Jain(xs); !math.IsNaN(j) {
			a.JainTenants = &j
		}
		if i == len(classes)-1 {
			ps.Total = a.ClassSummary
		} else if a.Requests > 0 {
			ps.Classes = append(ps.Classes, a.ClassSummary)
		}
	}
	if prompt > 0 {
		ps.PrefixHitRate = float64(cached) / float64(prompt)
	}
	for name, ts := range tenants {
		ts.TTFT = percentiles(tenantTTFT[name])
		ps.Tenants = append(ps.Tenants, *ts)
	}
	slices.SortFunc(ps.Tenants, func(a, b TenantSummary) int {
		switch {
		case a.Tenant < b.Tenant:
			return -1
		case a.Tenant > b.Tenant:
			return 1
		}
		return 0
	})
	ps.Sim = SimFigures{WallS: res.Wall.Seconds(), Decisions: res.Decisions, Instants: res.Instants}
	if res.Wall > 0 {
		ps.Sim.RequestsPerS = float64(len(out)) / res.Wall.Seconds()
	}
	if res.Decisions > 0 {
		ps.Sim.CoreNsPerDecision = float64(res.CoreTime.Nanoseconds()) / float64(res.Decisions)
	}
	return ps
}
