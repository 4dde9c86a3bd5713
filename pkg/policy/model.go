package policy

import (
	"cmp"
	"slices"
	"time"
)

// Queue policy names as they appear in configuration.
const (
	QueuePolicyFCFS = "fcfs"
	QueuePolicyWSPT = "wspt"
	QueuePolicyEDF  = "edf"
)

// DefaultQueuePolicy is the queue policy of a class that names none. It is
// edf, as in the reference router, so that migrated files order the same.
const DefaultQueuePolicy = QueuePolicyEDF

// SyntheticClassName is the name of the one class a profile without
// policy classes has (SPEC §2): quantum 1, fcfs, no busy threshold, so it
// never queues.
const SyntheticClassName = "default"

// Bucket is one uncached-ISL cache bucket: requests whose uncached prompt
// tokens are >= MinTokens and below the next bucket's MinTokens.
type Bucket struct {
	Name      string
	MinTokens int64
}

// Class is one physical policy class. Pointers are optional settings (nil =
// not set); integers are signed so that a negative value in a file reaches
// Validate and gets a message instead of a decoding error.
type Class struct {
	// Name is unique in its profile and matches [A-Za-z0-9_.-]+.
	Name string
	// Family and Bucket are both set (a family class) or both empty (an
	// explicit class, selected only by its Name).
	Family string
	Bucket string
	// QueuePolicy is fcfs, wspt or edf. The loaders fill in
	// DefaultQueuePolicy when the source names none.
	QueuePolicy string
	// Quantum is the DRR credit per ring round, in uncached tokens (> 0).
	Quantum int64
	// PrefillBusyThreshold and PrefillBusyThresholdFrac are the two fixed
	// busy tests (tokens, and a multiple of max_num_batched_tokens). A
	// class with neither has the threshold BusyMode names: BusyAuto (also
	// when BusyMode is empty, the default) or BusyNone (never queues).
	PrefillBusyThreshold     *int64
	PrefillBusyThresholdFrac *float64
	// BusyMode is prefill_busy_threshold's word form: "" (not written),
	// BusyAuto or BusyNone. It cannot go with a number or a fraction.
	BusyMode string
	// BusyWorkerRatio, in (0, 1], is the fraction of eligible endpoints that
	// must be busy for a shared head to wait. Needs a threshold.
	BusyWorkerRatio *float64
	// Per-worker queue limits; nil = unbounded.
	RequestQueueLimitPerWorker     *int64
	RawISLTokenQueueLimitPerWorker *int64
	CachedTokenQueueLimitPerWorker *int64
	// MaxQueueWait bounds queue wait (0 = unbounded). A Laneway extension of
	// the reference format (YAML key max_queue_wait).
	MaxQueueWait time.Duration
	// TenantFairness serves the class's tenants by DRR on uncached tokens
	// (SPEC §14); MaxTenants bounds its tenants with queued requests (nil:
	// DefaultMaxTenants). Laneway extensions (tenant_fairness,
	// max_tenants).
	TenantFairness bool
	MaxTenants     *int64
	// DisaggregateAboveUncachedTokens: in a pool with prefill pods, a
	// request of the class whose uncached prompt tokens are above it is
	// prefilled on a prefill pod and decoded on a decode pod; at or below
	// it the decode pod prefills it itself. Nil: the pool's default
	// (--disaggregate-above-uncached-tokens). A Laneway extension (YAML
	// key disaggregate_above_uncached_tokens).
	DisaggregateAboveUncachedTokens *int64
}

// Explicit reports whether the class is selected by name rather than by
// family and bucket.
func (c *Class) Explicit() bool { return c.Family == "" && c.Bucket == "" }

// The word forms of prefill_busy_threshold (YAML) and prefillBusyThreshold
// (PolicyClass).
const (
	// BusyAuto: the threshold follows the engine (pkg/autothreshold); the
	// default of a class that sets no threshold.
	BusyAuto = "auto"
	// BusyNone: no busy test, the class never queues.
	BusyNone = "none"
)

// Queueing reports whether the class has a busy threshold (a number, a
// fraction or auto); only such a class ever holds requests.
func (c *Class) Queueing() bool {
	return c.PrefillBusyThreshold != nil || c.PrefillBusyThresholdFrac != nil || c.BusyMode != BusyNone
}

// BusyAuto reports whether the class's threshold is auto: set so, or no
// threshold written at all.
func (c *Class) BusyAuto() bool {
	return c.PrefillBusyThreshold == nil && c.PrefillBusyThresholdFrac == nil && c.BusyMode != BusyNone
}

// Profile is one complete policy: buckets, defaults and classes. A profile
// without classes has the synthetic class only.
type Profile struct {
	DefaultFamily string
	Buckets       []Bucket
	// DefaultClass is where a request without a usable class header goes
	// in a profile without families; empty means the first class. With
	// families, such requests go to DefaultFamily instead.
	DefaultClass string
	Classes      []Class
	// EmptyClasses records that the source listed policy_classes as an
	// empty list, which is an error (as in the reference router): leaving
	// the key out is how a profile asks for the synthetic class.
	EmptyClasses bool
}

// HasFamilies reports whether any class names a family or a bucket.
func (p *Profile) HasFamilies() bool {
	for i := range p.Classes {
		if !p.Classes[i].Explicit() {
			return true
		}
	}
	return false
}

// ModelProfile is the profile of the requests for exactly one model name.
type ModelProfile struct {
	Model   string
	Profile Profile
}

// Config is a pool's whole policy: the root profile and the model profiles
// that replace it for their models. The zero Config is "no policy": every
// request goes to the synthetic default class.
type Config struct {
	Root   Profile
	Models []ModelProfile
	// Identity, Tenants and DefaultTenant are the pool's tenant rules
	// (SPEC §14; tenants.go). Nil Identity: no identity source, client
	// hints trusted. DefaultTenant is the rights of the identities no
	// binding matches; nil grants any class with the default caps.
	Identity      *Identity
	Tenants       []TenantBinding
	DefaultTenant *Rights
}

// Canonical returns a copy of c in a source-independent form, so that a
// Config loaded from a file and one read back from objects compare equal
// when they resolve and schedule alike: classes sorted by name, models
// sorted by model name, and an implicit default class (the first listed,
// in a profile without families) made explicit. Ring order is the one
// thing it discards; it affects where the DRR cursor starts, not shares.
func (c *Config) Canonical() *Config {
	out := &Config{Root: canonicalProfile(c.Root), Identity: c.Identity, Tenants: c.Tenants, DefaultTenant: c.DefaultTenant}
	for _, m := range c.Models {
		out.Models = append(out.Models, ModelProfile{Model: m.Model, Profile: canonicalProfile(m.Profile)})
	}
	slices.SortStableFunc(out.Models, func(a, b ModelProfile) int { return cmp.Compare(a.Model, b.Model) })
	return out
}

func canonicalProfile(p Profile) Profile {
	out := Profile{
		DefaultFamily: p.DefaultFamily,
		Buckets:       slices.Clone(p.Buckets),
		DefaultClass:  p.DefaultClass,
		Classes:       slices.Clone(p.Classes),
	}
	if out.DefaultClass == "" && !p.HasFamilies() && len(p.Classes) > 0 {
		out.DefaultClass = p.Classes[0].Name
	}
	slices.SortStableFunc(out.Classes, func(a, b Class) int { return cmp.Compare(a.Name, b.Name) })
	if len(out.Buckets) == 0 {
		out.Buckets = nil
	}
	if len(out.Classes) == 0 {
		out.Classes = nil
	}
	return out
}
