// Package simulate is `laneway simulate`: the picker's real scheduling
// core (pkg/sched over pkg/drr, with the policy compiled by pkg/policy)
// driven in virtual time against simulated model servers (pkg/engine, the
// timing model cmd/modelsim runs), so a day of traffic replays in seconds
// and policies compare on the same trace.
//
// A run is event-driven: the only instants processed are arrivals, the
// ends of engine steps, scrapes, retries and queue-wait deadlines, kept in
// one heap (a pkg/iheap heap keyed by time). At each instant the engines
// whose step ended report first tokens and ends (Release on the core),
// arrivals are admitted, the core is drained once, its grants are
// submitted to their servers' engines, and the engines start their next
// steps. Idle servers cost nothing, and a long
// decode is one event (engine.Config.Coalesce). Nothing else schedules: the
// admission, limits, busy test, prefix index, DRR and picks are the core's,
// and TestOneSchedulerCore checks that the package has no second copy.
//
// Inputs are a trace (Laneway JSONL, a Mooncake trace whose hash ids
// become token-id prompts equal exactly where the ids are, an Azure LLM
// inference trace CSV, several of them merged, or --generate's synthetic
// streams; time-scaled and truncated by TraceOptions), rules that give
// requests without one a class header or a tenant, a fleet (identical servers or a fleet file),
// and policies (YAML files, CRD manifests, the none and round-robin
// baselines). Outputs are requests.jsonl per policy, summary.json, the
// table and three side-by-side figures. A run is deterministic for a seed.
// The same outputs describe a replay through real processes
// (internal/testbed/replay fills a NewResult), so the two compare line for
// line.
//
// Cost: O(log h) per event for h pending events, plus the core's own costs
// (pkg/sched) per admission and dispatch and the engine's per step; memory
// is O(requests) for the outcomes and O(in flight) for the rest.
package simulate
