package simulate

import (
	"math"
	"slices"
	"sort"
	"strings"

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
	// ITL is the inter-token latency, first to last token over the
	// tokens after the first, of completed requests of two tokens or more.
	ITL Percentiles `json:"itl_ms"`
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
	PrefixHitRate float64 `json:"prefix_hit_rate"`
	// Disaggregated counts the requests prefilled on a prefill server and
	// decoded on another; LoRALoads the adapter loads of every engine.
	Disaggregated int             `json:"disaggregated"`
	LoRALoads     uint64          `json:"lora_loads"`
	Tenants       []TenantSummary `json:"tenants,omitempty"`
	Sim           SimFigures      `json:"sim"`
}

// Summarize computes a run's figures.
func Summarize(t *Trace, res *Result) PolicySummary {
	ps := PolicySummary{Policy: res.Policy.Name, Picker: res.Policy.Picker, Baseline: res.Policy.Baseline}
	tl := runTimeline(t, res.Outcomes)
	ps.FirstN, ps.MakespanS, ps.WindowS = tl.firstN, tl.makespan, float64(tl.window-tl.t0)/1e9
	classes := newClassAccs(res.Classes)
	tenants := tenantAccs{}
	var prompt, cached int64
	for i := range res.Outcomes {
		o, q := &res.Outcomes[i], &t.Requests[i]
		r := requestFigures{
			uncached: int64(q.PromptTokens) - int64(min(int(o.Cached), q.PromptTokens)),
			inWindow: o.Server >= 0 && o.Leave <= tl.window,
			inFirstN: tl.inFirstN[i],
		}
		classes[o.Class].add(o, q, r)
		classes[len(classes)-1].add(o, q, r)
		tenants.add(o, q, r)
		if o.Status == 200 {
			prompt += int64(q.PromptTokens)
			cached += int64(o.EngineCached)
		}
		if o.Prefill >= 0 {
			ps.Disaggregated++
		}
	}
	ps.LoRALoads = res.LoRALoads
	ps.Classes, ps.Total = finishClasses(classes, tl.makespan)
	if prompt > 0 {
		ps.PrefixHitRate = float64(cached) / float64(prompt)
	}
	ps.Tenants = tenants.summaries()
	ps.Sim = simFigures(res)
	return ps
}

// timeline is when a run's contended part happened.
type timeline struct {
	t0 int64 // the first arrival
	// makespan is first arrival to last token, in seconds.
	makespan float64
	// window ends the contended window: the last arrival, or for a trace
	// released at one instant the firstN-th completion.
	window int64
	// firstN is half of the completions; inFirstN marks them by request.
	firstN   int
	inFirstN []bool
}

// runTimeline orders the completions and finds the makespan, the
// contended window and the first half of the completions.
func runTimeline(t *Trace, out []Outcome) timeline {
	tl := timeline{t0: t.Requests[t.byArrival[0]].Arrival}
	lastArrival := t.Requests[t.byArrival[len(t.byArrival)-1]].Arrival
	var done []int32 // completed requests, in completion order
	lastEnd := tl.t0
	for i := range out {
		if out[i].Status == 200 {
			done = append(done, int32(i))
			lastEnd = max(lastEnd, out[i].End)
		}
	}
	sort.SliceStable(done, func(a, b int) bool { return out[done[a]].End < out[done[b]].End })
	tl.firstN = len(done) / 2
	tl.makespan = float64(lastEnd-tl.t0) / 1e9
	tl.window = lastArrival
	if tl.window == tl.t0 && tl.firstN > 0 {
		tl.window = out[done[tl.firstN-1]].End
	}
	tl.inFirstN = make([]bool, len(out))
	for _, i := range done[:tl.firstN] {
		tl.inFirstN[i] = true
	}
	return tl
}

// requestFigures are what one request adds besides its outcome.
type requestFigures struct {
	uncached           int64 // its uncached prompt tokens (SPEC §1)
	inWindow, inFirstN bool
}

// classAcc accumulates one class's (or the total's) figures.
type classAcc struct {
	ClassSummary
	ttft, wait, lat, itl []int64
	tenants              map[string]int64 // window uncached tokens per tenant
}

// newClassAccs returns an accumulator per class, and the total's last.
func newClassAccs(names []string) []*classAcc {
	classes := make([]*classAcc, len(names)+1)
	for i := range classes {
		name := "total"
		if i < len(names) {
			name = names[i]
		}
		classes[i] = &classAcc{ClassSummary: ClassSummary{Class: name}, tenants: map[string]int64{}}
	}
	return classes
}

// add counts one request.
func (a *classAcc) add(o *Outcome, q *Request, r requestFigures) {
	a.Requests++
	if q.Tenant != "" {
		if _, ok := a.tenants[q.Tenant]; !ok {
			a.tenants[q.Tenant] = 0
		}
	}
	if o.Queued {
		a.Queued++
	}
	if r.inWindow {
		a.WindowUncached += r.uncached
		if q.Tenant != "" {
			a.tenants[q.Tenant] += r.uncached
		}
	}
	switch o.Status {
	case 200:
		a.Completed++
		a.ttft = append(a.ttft, o.First-q.Arrival)
		a.wait = append(a.wait, o.Leave-q.Arrival)
		a.lat = append(a.lat, o.End-q.Arrival)
		if q.OutputTokens > 1 {
			a.itl = append(a.itl, (o.End-o.First)/int64(q.OutputTokens-1))
		}
		a.OutputTokens += int64(q.OutputTokens)
		if r.inFirstN {
			a.FirstN++
		}
	case 429:
		a.Rejected429++
	case 503:
		a.Unavailable503++
	}
}

// finishClasses turns the accumulators (the total last) into the
// summaries of the classes with requests and of the total.
func finishClasses(classes []*classAcc, makespan float64) ([]ClassSummary, ClassSummary) {
	var out []ClassSummary
	total := classes[len(classes)-1]
	for i, a := range classes {
		a.TTFT, a.QueueWait, a.Latency = percentiles(a.ttft), percentiles(a.wait), percentiles(a.lat)
		a.ITL = percentiles(a.itl)
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
		if i < len(classes)-1 && a.Requests > 0 {
			out = append(out, a.ClassSummary)
		}
	}
	return out, total.ClassSummary
}

// tenantAccs accumulates the figures of each tenant.
type tenantAccs map[string]*tenantAcc

type tenantAcc struct {
	TenantSummary
	ttft []int64
}

// add counts one request of a tenant; requests without one count for
// none.
func (ts tenantAccs) add(o *Outcome, q *Request, r requestFigures) {
	if q.Tenant == "" {
		return
	}
	a := ts[q.Tenant]
	if a == nil {
		a = &tenantAcc{TenantSummary: TenantSummary{Tenant: q.Tenant}}
		ts[q.Tenant] = a
	}
	a.Requests++
	switch o.Status {
	case 200:
		a.Completed++
		a.ttft = append(a.ttft, o.First-q.Arrival)
	case 429:
		a.Rejected429++
	}
	if r.inWindow {
		a.WindowUncached += r.uncached
	}
}

// summaries are the tenants' figures, by tenant name.
func (ts tenantAccs) summaries() []TenantSummary {
	var out []TenantSummary
	for _, a := range ts {
		a.TTFT = percentiles(a.ttft)
		out = append(out, a.TenantSummary)
	}
	slices.SortFunc(out, func(a, b TenantSummary) int { return strings.Compare(a.Tenant, b.Tenant) })
	return out
}

// simFigures are the simulator's own costs of run res.
func simFigures(res *Result) SimFigures {
	f := SimFigures{WallS: res.Wall.Seconds(), Decisions: res.Decisions, Instants: res.Instants}
	if res.Wall > 0 {
		f.RequestsPerS = float64(len(res.Outcomes)) / res.Wall.Seconds()
	}
	if res.Decisions > 0 {
		f.CoreNsPerDecision = float64(res.CoreTime.Nanoseconds()) / float64(res.Decisions)
	}
	return f
}
