package sched

import (
	"errors"
	"fmt"
	"time"

	"github.com/laneway-dev/laneway/pkg/drr"
	"github.com/laneway-dev/laneway/pkg/policy"
)

// Policy is a compiled class table: the DRR classes, their busy rules (same
// index) and the function that resolves a ticket to a class index. It is a
// snapshot: the core never modifies it.
type Policy struct {
	Classes []drr.ClassConfig
	Busy    []policy.BusyTest
	// Resolve maps a ticket to an index of Classes. It runs on the core's
	// goroutine, also for queued tickets when the policy changes, so it must
	// be fast and must not block. An index out of range means class 0. It
	// runs after Rights, so it may read t.Rights.
	Resolve func(t *Ticket) int
	// Rights, when set, resolves a ticket's tenant (SPEC §14): its queue
	// identity, weight and limits, its allowed classes and hint caps. Nil:
	// no tenants, hints as sent. Same rules as Resolve.
	Rights func(t *Ticket) policy.TenantRights
	// Identity is where the policy says a request's tenant identity comes
	// from; nil: the x-laneway-tenant header, trusted. The request path
	// reads it to fill Ticket.Tenant.
	Identity *policy.Identity
	// Disaggregate is each class's disaggregation threshold (same index as
	// Classes); a class beyond its end, or not Set, takes
	// Options.DisaggregateAboveUncachedTokens.
	Disaggregate []policy.Disaggregation
}

// FromCompiled adapts a compiled policy: classes resolve by the ticket's
// model, class header and uncached tokens (SPEC §2).
func FromCompiled(c *policy.Compiled) *Policy {
	return &Policy{
		Classes:  c.Classes,
		Busy:     c.Busy,
		Resolve:  func(t *Ticket) int { return c.ResolveFor(t.Model, t.ClassHeader, t.Uncached(), &t.Rights) },
		Rights:   func(t *Ticket) policy.TenantRights { return c.Rights(t.Tenant) },
		Identity: c.Identity(),

		Disaggregate: c.Disaggregate,
	}
}

// Validate reports a policy the core cannot run: no classes, a busy rule
// missing, or no resolver.
func (p *Policy) Validate() error {
	if p == nil || len(p.Classes) == 0 {
		return errors.New("policy has no classes")
	}
	if len(p.Busy) != len(p.Classes) {
		return fmt.Errorf("policy has %d classes but %d busy rules", len(p.Classes), len(p.Busy))
	}
	if p.Resolve == nil {
		return errors.New("policy has no resolver")
	}
	return nil
}

// hasAuto reports whether some class has an auto threshold.
func (p *Policy) hasAuto() bool {
	for i := range p.Busy {
		if p.Busy[i].Auto {
			return true
		}
	}
	return false
}

// entitle sets the ticket's tenant rights (the zero rights without tenants).
func (p *Policy) entitle(t *Ticket) {
	if p.Rights == nil {
		t.Rights = policy.TenantRights{}
		return
	}
	t.Rights = p.Rights(t)
}

// rejectionReason is the metrics reason of a queue-limit rejection:
// queue_limit_<kind> for the class's limits and its tenant bound,
// tenant_limit_<kind> for a tenant's own.
func rejectionReason(r *drr.Rejection) string {
	if r.Tenant != "" && r.Kind != drr.LimitTenants {
		return ReasonTenantLimit + "_" + string(r.Kind)
	}
	return ReasonQueueLimit + "_" + string(r.Kind)
}

// resolve is Resolve with out-of-range answers mapped to class 0.
func (p *Policy) resolve(t *Ticket) int {
	c := p.Resolve(t)
	if c < 0 || c >= len(p.Classes) {
		return 0
	}
	return c
}

// Ticket is one request as the core sees it: who it is (for class
// resolution), what it costs, how it is ordered and where it may go.
type Ticket struct {
	// Model and ClassHeader feed Policy.Resolve.
	Model       string
	ClassHeader string
	// RawISL and Cached are the cost snapshot of SPEC §1.
	RawISL uint64
	Cached uint64
	// Priority and Strict are the ordering hints of SPEC §3. HasPriority
	// says the request carried a priority hint (body or header), which is
	// what may be forwarded to the engine.
	Priority    int32
	Strict      uint32
	HasPriority bool
	// Blocks are the prompt's chained block hashes (pkg/tokenize) at
	// BlockSize tokens per block, for the prefix-cache index: the core
	// fills Cached from them at admission (the best overlap over the
	// eligible endpoints) and records them on the endpoint it picks. Nil
	// leaves Cached as it is. The core reads them until the request leaves.
	Blocks    []uint64
	BlockSize int
	// Allow, when HasAllow, restricts the request to these "ip" or
	// "ip:port" entries (subset hint, conformance header). An empty list
	// with HasAllow answers 503. When it names exactly one endpoint the
	// request is pinned to that endpoint's exact lane.
	Allow    []string
	HasAllow bool
	// RankLo..RankHi, when HasRanks, bounds the data-parallel ranks the
	// request may go to (x-laneway-dp-rank).
	RankLo, RankHi int
	HasRanks       bool
	// Tenant is who the request is for (SPEC §14): the identity the
	// policy's identity source gave, or without one the x-laneway-tenant
	// header; "" when the request brought none.
	Tenant string
	// Waited is how long the request has already waited before this
	// admission: a follower's ticket re-offered after its leader failed,
	// or first offered to a leader over the replica link. Admit takes
	// it as having arrived that much before now, so its place in a FCFS
	// lane, its wait budget and its reported wait count from its first
	// arrival. 0 for a request that arrives now.
	Waited time.Duration
	// OutputTokens is how many tokens the request expects to generate:
	// its nvext.agent_hints.osl, else its max_completion_tokens or
	// max_tokens; 0 when it gave none. The auto threshold weighs it
	// against the engine's cache (SPEC §5); nothing else reads it.
	OutputTokens uint64
	// Class is the resolved class index, set by the core.
	Class int
	// Rights are the tenant's rights under the policy in force, set by the
	// core before the class is resolved.
	Rights policy.TenantRights
}

// Uncached is the ticket's uncached prompt tokens (SPEC §1).
func (t *Ticket) Uncached() uint64 { return drr.Uncached(t.RawISL, t.Cached) }

// EffectivePriority is the soft priority as its tenant may have it (the
// hint clamped to the grant's cap): what orders the queue and what may be
// forwarded to the engine.
func (t *Ticket) EffectivePriority() int32 { return t.Rights.CapPriority(t.Priority) }

// EffectiveStrict is the strict tier as its tenant may have it.
func (t *Ticket) EffectiveStrict() uint32 { return t.Rights.CapStrict(t.Strict) }

// Endpoint is one model-server endpoint (pod × target port) in a snapshot
// handed to SetEndpoints.
type Endpoint struct {
	// Addr is "ip:port".
	Addr string
	// MaxBatchedTokens is the engine's max_num_batched_tokens; 0 = unknown.
	MaxBatchedTokens uint64
	// Tainted endpoints take no new unpinned requests (being deleted, not
	// ready, or annotated NoSchedule).
	Tainted bool
	// Rank is the endpoint's data-parallel rank: the position of its port
	// among the pool's target ports (SPEC §5), from 0.
	Rank int
	// Engine names the model server's engine (vllm, sglang, trtllm: the
	// pod label inference.networking.k8s.io/engine-type); empty, or a name
	// policy.ParseEngine does not know, means Options.DefaultEngine. It
	// chooses the metric names scraped and the polarity of a forwarded
	// priority.
	Engine string
	// Role is what the endpoint serves in a disaggregated pool (the pod
	// label llm-d.ai/role); the zero value serves whole requests.
	Role Role
}

// EngineOf resolves an endpoint's engine name against the default.
func EngineOf(name string, def policy.Engine) policy.Engine {
	if name == "" {
		return def
	}
	e, err := policy.ParseEngine(name)
	if err != nil {
		return def
	}
	return e
}

// NoEndpointError answers 503: no endpoint is eligible for the request.
type NoEndpointError struct {
	// Filter names what removed the last candidate (for the answer).
	Filter string
}

func (e *NoEndpointError) Error() string {
	return "no eligible endpoint: " + e.Filter
}

// ShedError answers 429: the request waited past its class's budget.
type ShedError struct {
	Class  string
	Waited time.Duration
	Budget time.Duration
}

func (e *ShedError) Error() string {
	return fmt.Sprintf("policy class %q: queued %s, past its wait budget of %s", e.Class, e.Waited.Round(time.Millisecond), e.Budget)
}

// ErrShuttingDown answers 503: the core is draining.
var ErrShuttingDown = errors.New("endpoint picker is shutting down")

// ErrCancelled is the error of a request whose caller gave up while it was
// queued (nobody reads the answer; metrics count it).
var ErrCancelled = errors.New("request cancelled by its caller while queued")

// Reasons name why a request was answered with an error, as the
// laneway_rejections_total reason label spells them.
const (
	ReasonQueueLimit   = "queue_limit"  // prefix: the limit kind follows after "_"
	ReasonTenantLimit  = "tenant_limit" // prefix: a tenant's own limit, the kind after "_"
	ReasonShed         = "shed"
	ReasonNoEndpoints  = "no_endpoints"
	ReasonShuttingDown = "shutting_down"
	ReasonCancelled    = "cancelled"
)

// Leave is one decision about one request: it was granted an endpoint
// (Grant set) or answered with an error (Err and Reason set). Every
// admitted Request produces exactly one Leave.
type Leave struct {
	Req *Request
	// Grant is the endpoint given, nil for an error.
	Grant *Grant
	// Err is the answer of a request that was not granted: *drr.Rejection
	// (429), *ShedError (429), *NoEndpointError (503), ErrShuttingDown
	// (503) or ErrCancelled.
	Err error
	// Reason is the metrics reason of Err (see the Reason constants; limit
	// rejections say queue_limit_<kind>).
	Reason string
	// Class is the name of the request's class when it left; Tenant its
	// tenant in the queue ("" when the policy tracks none) and Uncached
	// its uncached prompt tokens (what a grant charges).
	Class    string
	Tenant   string
	Weight   uint64 // the tenant's DRR weight (1 without tenants)
	Uncached uint64
	// Queued says the request waited in the queue; Wait is how long
	// (0 for a direct grant).
	Queued bool
	Wait   time.Duration
}

// StatusOf is the HTTP status the picker answers for a Leave's Err: 429
// for a limit (a class's or a tenant's own, *drr.Rejection) and for a
// wait-budget shed (*ShedError), which a client may retry later; 503 for
// the rest (no endpoint, shutting down, cancelled).
func StatusOf(err error) int {
	var rej *drr.Rejection
	var shed *ShedError
	if errors.As(err, &rej) || errors.As(err, &shed) {
		return 429
	}
	return 503
}

// EndpointSnapshot is one endpoint's accounting for metrics.
type EndpointSnapshot struct {
	Addr          string
	ActivePrefill uint64
	InFlight      int
	Tainted       bool
	// Stale: the endpoint's metrics are expected and not fresh.
	Stale bool
	// UnseenWaiting is the estimate of requests waiting in the engine that
	// this picker did not send, and UnseenPrefill their prompt tokens as
	// the busy test counts them.
	UnseenWaiting int
	UnseenPrefill uint64
	// IndexTokens is the prompt tokens the prefix index remembers for it.
	IndexTokens uint64
	// EngineWaiting is the engine's whole waiting queue at its last fresh
	// scrape (0 without scraping); MaxBatchedTokens its
	// max_num_batched_tokens (0 unknown).
	EngineWaiting    int
	MaxBatchedTokens uint64
	// Busy: stale, or busy for every class that queues.
	Busy bool
	// Role is the endpoint's role.
	Role Role
	// AwaitingEngine is the grants whose stream ended before a first byte
	// was reported and whose prefill the engine has not confirmed yet:
	// still charged to ActivePrefill (SPEC §5).
	AwaitingEngine int
	// OthersOnTheirWay is the prefill the busy test counts for the other
	// replicas' requests on their way to the engine, in proportion to the
	// awaiting grants (SPEC §5): 0 behind gateways that report response
	// phases.
	OthersOnTheirWay uint64
	// ArrivalShare is the part of the engine's arrivals the picker takes
	// for its own grants when it reconciles the awaiting ones (SPEC §5):
	// 1/2 while cold, 1 once the engine's counts have shown it alone
	// twice, then what full windows measure.
	ArrivalShare float64
	// PrefillRate is the engine's prefill rate the picker learned from its
	// prompt-token counter, in prompt tokens per second (0: not learned).
	PrefillRate float64
	// AutoThreshold is the endpoint's auto threshold in tokens (SPEC §5),
	// when HasAuto: some class of the policy in force has one.
	AutoThreshold uint64
	HasAuto       bool
	// ExpectedOutput is the output per request the auto threshold expects
	// at the endpoint (SPEC §5, the decode-bound level): what the
	// dispatched requests asked for, lowered to the engine's own mean once
	// it finished some; 0 when no prediction is made.
	ExpectedOutput uint64
}

// Snapshot is the core's state at one instant.
type Snapshot struct {
	Classes   []drr.ClassStats
	Endpoints []EndpointSnapshot
	Queued    int
}
