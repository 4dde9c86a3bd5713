package simulate

// NewResult returns a result of policy p over t as a run starts one: the
// policy's class names and every outcome "never" (times -1, no server). A
// driver other than Run (a replay through real processes,
// internal/testbed/replay) fills it in, and Summarize, WriteOutputs and
// WritePlots then describe the real run exactly as they describe a
// simulated one.
func NewResult(t *Trace, p *Policy) *Result {
	res := &Result{Policy: p, Trace: t, Outcomes: make([]Outcome, len(t.Requests))}
	for i := range p.Compiled.Classes {
		res.Classes = append(res.Classes, p.Compiled.Classes[i].Name)
	}
	for i := range res.Outcomes {
		res.Outcomes[i] = Outcome{Leave: -1, Start: -1, First: -1, End: -1, Server: -1, Prefill: -1}
	}
	return res
}

// ClassIndex is the index in Result.Classes of the class the picker
// resolves a request to under p: by its class header and tenant, and, for
// a policy with length buckets, its uncached prompt tokens (SPEC §2).
func (p *Policy) ClassIndex(q *Request, uncached uint64) uint16 {
	rights := p.Compiled.Rights(q.Tenant)
	return uint16(p.Compiled.ResolveFor("", q.Class, uncached, &rights))
}

// NewSummary is summary.json of results over t on f, as RunAll makes it:
// the results may come from Run or from another driver (NewResult).
func NewSummary(t *Trace, f *Fleet, seed uint64, results []*Result) *Summary {
	sum := &Summary{
		Trace: TraceInfo{Source: t.Source, Requests: len(t.Requests), SpanS: t.Span().Seconds(), Tenants: t.Tenants()},
		Fleet: fleetInfo(f),
		Seed:  seed,
	}
	for _, res := range results {
		sum.Policies = append(sum.Policies, Summarize(t, res))
	}
	return sum
}
