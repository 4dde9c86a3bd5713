package drr

import (
	"fmt"
	"math"
	"math/bits"
	"time"
)

// Policy orders the requests inside one lane of a class (SPEC §3).
type Policy uint8

const (
	// FCFS orders by arrival, with the soft priority as a bump of that many
	// seconds of earlier arrival.
	FCFS Policy = iota
	// WSPT orders by (1 + priority) / scheduling cost, higher first: short
	// uncached prompts go first, which minimises mean time to first token.
	WSPT
	// EDF orders by due time, then arrival; it ignores both priorities.
	EDF
)

// String returns the policy's configuration name.
func (p Policy) String() string {
	switch p {
	case FCFS:
		return "fcfs"
	case WSPT:
		return "wspt"
	case EDF:
		return "edf"
	}
	return fmt.Sprintf("Policy(%d)", uint8(p))
}

// ParsePolicy reads a configuration name (fcfs, wspt, edf).
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "fcfs":
		return FCFS, nil
	case "wspt":
		return WSPT, nil
	case "edf":
		return EDF, nil
	}
	return 0, fmt.Errorf("unknown queue_policy %q (want fcfs, wspt or edf)", s)
}

// NoLimit is the per-worker limit value that disables a limit. Any other
// value, 0 included, is enforced (a limit of 0 rejects every queued request).
const NoLimit uint64 = math.MaxUint64

// ClassConfig is one physical policy class as the scheduler sees it. The
// busy thresholds are not here: whether an endpoint is busy for a class is
// the caller's business and reaches the scheduler through a Probe.
type ClassConfig struct {
	// Name identifies the class across reconfigurations (deficits of a class
	// that keeps its name survive SetClasses).
	Name string
	// Quantum is the credit, in uncached tokens, the class earns per ring
	// round. It must be > 0.
	Quantum uint64
	// Policy orders the class's lanes.
	Policy Policy
	// Queueing is true when the class has a busy threshold. A class without
	// one never queues: every request is dispatched directly.
	Queueing bool
	// RequestLimitPerWorker, RawISLLimitPerWorker and CachedLimitPerWorker
	// bound the queued requests, raw prompt tokens and cached tokens of the
	// class, per endpoint of the pool. NoLimit disables one.
	RequestLimitPerWorker uint64
	RawISLLimitPerWorker  uint64
	CachedLimitPerWorker  uint64
	// WaitBudget bounds queue wait; 0 means unbounded. A request that has
	// waited longer is shed (Expired). Under EDF it is also the deadline of
	// a request that brings none.
	WaitBudget time.Duration
	// TenantFairness splits the class's shared heap into one sub-queue per
	// tenant, each in the class's order, served by a second DRR over the
	// backlogged tenants: quantum Quantum × the tenant's weight, cost the
	// scheduling cost, the deficit, bulk-round and cursor rules of the
	// class ring. A tenant whose head has a higher strict tier goes first.
	// Exact lanes are not split.
	TenantFairness bool
	// MaxTenants bounds the tenants with queued requests in the class; an
	// offer from one more is rejected (LimitTenants). 0 means no bound.
	MaxTenants int
}

// Tenant is who a request is for, as far as queueing goes: the tenant's
// DRR weight inside a tenant-fair class and its own queue limits in the
// class. The zero value is no tenant (no per-tenant limits, and in a
// tenant-fair class the anonymous tenant "").
type Tenant struct {
	// Name identifies the tenant within a class.
	Name string
	// Weight multiplies the class quantum for the tenant; 0 counts as 1.
	Weight uint64
	// RequestLimit and RawISLLimit bound the tenant's queued requests and
	// raw prompt tokens in one class (absolute, not per worker); 0 is
	// taken as NoLimit, as is NoLimit itself.
	RequestLimit uint64
	RawISLLimit  uint64
}

// EndpointID names one endpoint (one pod × target port). The caller assigns
// IDs; the scheduler only compares them.
type EndpointID uint32

// NoEndpoint marks a request that is not pinned to one endpoint.
const NoEndpoint EndpointID = math.MaxUint32

// Request is what the caller knows about a request when it offers it. The
// scheduler copies it into an Item at enqueue; nothing in it changes while
// the request waits (SPEC §1).
type Request struct {
	// Class is the index of the request's physical class in the slice last
	// passed to New or SetClasses. (32 bits, next to Pinned: an Item must
	// stay within its malloc size class.)
	Class int32
	// Pinned is the endpoint of the request's exact lane, or NoEndpoint for
	// the shared heap.
	Pinned EndpointID
	// RawISL is the prompt length in tokens.
	RawISL uint64
	// Cached is the best prefix-cache overlap in tokens; values above RawISL
	// are clamped.
	Cached uint64
	// Priority is the soft priority (higher first); negatives count as 0.
	Priority int32
	// StrictPriority is the strict tier (higher always first).
	StrictPriority uint32
	// Arrival is the caller's clock reading at arrival, in nanoseconds.
	Arrival int64
	// Due is an explicit deadline in the same clock, or 0 for none.
	Due int64
	// Payload is the caller's own handle (for example the waiting stream).
	Payload any
}

// Uncached returns the prompt tokens not covered by the prefix cache.
func (r *Request) Uncached() uint64 { return Uncached(r.RawISL, r.Cached) }

// Cost returns the scheduling cost: max(1, uncached tokens).
func (r *Request) Cost() uint64 { return Cost(r.RawISL, r.Cached) }

// Uncached is SPEC §1's uncached = raw_isl - min(cached, raw_isl): the
// prompt tokens an endpoint must prefill. It is the one place the formula
// is written; every package that needs it calls this.
func Uncached(rawISL, cached uint64) uint64 {
	if cached >= rawISL {
		return 0
	}
	return rawISL - cached
}

// Cost is SPEC §1's scheduling cost, max(1, uncached): the DRR charge and
// the WSPT weight.
func Cost(rawISL, cached uint64) uint64 { return max(1, Uncached(rawISL, cached)) }

// Verdict is a Probe's answer about a head of line.
type Verdict uint8

const (
	// Ready means the head may be dispatched now.
	Ready Verdict = iota
	// Blocked means every eligible endpoint is busy: the head waits and its
	// lane waits behind it.
	Blocked
	// Unroutable means the head has no eligible endpoint at all; the
	// scheduler hands it back with Outcome NoRoute (answered 503) instead
	// of parking it.
	Unroutable
)

// Probe tells the scheduler whether heads of line can be dispatched. The
// scheduler caches a lane's verdict until EndpointChanged reports that
// lane's endpoint; shared-heap heads are asked every time they compete.
type Probe interface {
	// Shared judges the head of a class's shared heap (an unpinned request,
	// possibly with an allow-list the caller keeps in the payload).
	Shared(class int, it *Item) Verdict
	// Lane judges the exact lane of endpoint ep in a class.
	Lane(class int, ep EndpointID) Verdict
}

// Outcome says why Pop returned an item.
type Outcome uint8

const (
	// None: nothing can leave the queue now; the item is nil.
	None Outcome = iota
	// Dispatch: the item won arbitration and its cost was charged.
	Dispatch
	// Expired: the item waited past its class's WaitBudget; it was removed
	// without charging deficit or moving the cursor (answer 429).
	Expired
	// NoRoute: the item's head verdict was Unroutable (no eligible
	// endpoint); it was removed without charging deficit or moving the
	// cursor (answer 503).
	NoRoute
)

// LimitKind names the queue limit a rejection hit.
type LimitKind string

// The limit kinds, spelled as in the 429 body (SPEC §5).
const (
	LimitRequests     LimitKind = "requests"
	LimitRawISLTokens LimitKind = "raw_isl_tokens"
	LimitCachedTokens LimitKind = "cached_tokens"
	// LimitTenants: the class has MaxTenants tenants with queued requests
	// and the offer is from another one.
	LimitTenants LimitKind = "tenants"
)

// Rejection is returned by Offer when a class's queue limit is reached. It
// carries the numbers the 429 body reports. Tenant is set when the limit is
// the tenant's own (its RequestLimit or RawISLLimit) or the class's tenant
// bound (LimitTenants: the tenant that would have been one too many).
type Rejection struct {
	Class   string
	Tenant  string
	Kind    LimitKind
	Current uint64
	Limit   uint64
}

// Error implements error.
func (r *Rejection) Error() string {
	switch {
	case r.Kind == LimitTenants:
		return fmt.Sprintf("policy class %q tenant limit reached: %d tenants queued >= limit %d (tenant %q is not queued yet)",
			r.Class, r.Current, r.Limit, r.Tenant)
	case r.Tenant != "":
		return fmt.Sprintf("policy class %q queue limit of tenant %q reached: %s current %d >= limit %d",
			r.Class, r.Tenant, r.Kind, r.Current, r.Limit)
	}
	return fmt.Sprintf("policy class %q queue limit reached: %s current %d >= limit %d",
		r.Class, r.Kind, r.Current, r.Limit)
}

// ClassStats is a snapshot of one class for metrics.
type ClassStats struct {
	Name          string
	Pending       uint64 // queued requests
	PendingRawISL uint64 // sum of queued raw prompt tokens
	PendingCached uint64 // sum of queued cached tokens
	Deficit       uint64 // earned, unspent credit
	Tenants       int    // tenants with queued requests
}

// SaturatingMul returns a×b, or math.MaxUint64 when that overflows.
func SaturatingMul(a, b uint64) uint64 {
	// A 128-bit product instead of a division: this runs per class in
	// every bulk-credit arbitration.
	if hi, lo := bits.Mul64(a, b); hi == 0 {
		return lo
	}
	return math.MaxUint64
}

// SaturatingAdd returns a+b, or math.MaxUint64 when that overflows.
func SaturatingAdd(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxUint64
}

// String names the verdict.
func (v Verdict) String() string {
	switch v {
	case Ready:
		return "Ready"
	case Blocked:
		return "Blocked"
	case Unroutable:
		return "Unroutable"
	}
	return fmt.Sprintf("Verdict(%d)", uint8(v))
}

// String names the outcome.
func (o Outcome) String() string {
	switch o {
	case None:
		return "None"
	case Dispatch:
		return "Dispatch"
	case Expired:
		return "Expired"
	case NoRoute:
		return "NoRoute"
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}
