package policy

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/laneway-dev/laneway/pkg/drr"
)

// UnknownMaxBatchedTokens is the max_num_batched_tokens assumed for an
// endpoint that has not reported one (SPEC §5): large enough that a
// fractional threshold never makes an unknown endpoint busy by accident.
const UnknownMaxBatchedTokens = 10_000_000

// BusyTest is one class's busy-test parameters (SPEC §5). The dispatcher
// evaluates it against endpoint state; the scheduler only sees the verdict.
type BusyTest struct {
	// Threshold (tokens) applies when HasThreshold.
	Threshold    uint64
	HasThreshold bool
	// Frac (times max_num_batched_tokens) applies when HasFrac.
	Frac    float64
	HasFrac bool
	// Auto: the threshold is the endpoint's auto threshold
	// (pkg/autothreshold), which the scheduling core keeps per endpoint;
	// EndpointBusy and Limit do not know it and ignore Auto.
	Auto bool
	// Ratio is busy_worker_ratio in (0, 1]; 0 means unset (a shared head
	// waits only while all its eligible endpoints are busy).
	Ratio float64
}

// Queueing reports whether the class has a threshold of any kind.
func (b *BusyTest) Queueing() bool { return b.HasThreshold || b.HasFrac || b.Auto }

// EndpointBusy reports whether an endpoint with activePrefill prompt tokens
// in prefill is busy for the class. maxBatched is the endpoint's
// max_num_batched_tokens, 0 when unknown. Comparisons are strict (>).
func (b *BusyTest) EndpointBusy(activePrefill, maxBatched uint64) bool {
	if b.HasThreshold && activePrefill > b.Threshold {
		return true
	}
	if b.HasFrac {
		if maxBatched == 0 {
			maxBatched = UnknownMaxBatchedTokens
		}
		if float64(activePrefill) > b.Frac*float64(maxBatched) {
			return true
		}
	}
	return false
}

// Limit is the most prompt tokens in prefill an endpoint with maxBatched
// (0: unknown) may have and not be busy for the class: the smaller of its
// rules, 0 for a class without one.
func (b *BusyTest) Limit(maxBatched uint64) uint64 {
	if maxBatched == 0 {
		maxBatched = UnknownMaxBatchedTokens
	}
	limit, has := uint64(0), false
	if b.HasThreshold {
		limit, has = b.Threshold, true
	}
	if b.HasFrac {
		f := min(b.Frac*float64(maxBatched), float64(math.MaxUint64>>1))
		if v := uint64(f); !has || v < limit {
			limit, has = v, true
		}
	}
	return limit
}

// ratioEpsilon absorbs the rounding of ratio × eligible (0.3 × 10 is
// 3.0000000000000004 in binary floating point, and 3 busy of 10 must count).
const ratioEpsilon = 1e-9

// SharedBlocked reports whether a shared head whose eligible set has
// `eligible` endpoints, `busy` of them busy, must wait: all busy, or with a
// ratio, at least ratio × eligible busy. eligible == 0 is not "blocked"
// (the request is unroutable, a different answer).
func (b *BusyTest) SharedBlocked(busy, eligible int) bool {
	if eligible <= 0 {
		return false
	}
	if b.Ratio > 0 {
		return float64(busy) >= b.Ratio*float64(eligible)-ratioEpsilon
	}
	return busy >= eligible
}

// ClassInfo describes a compiled class for logs, metrics and status.
type ClassInfo struct {
	// Model is the model profile of the class; "" for the root profile.
	Model string
	// Name is the class name within its profile (the policy_class label).
	Name string
	// Family and Bucket are empty for an explicit class.
	Family string
	Bucket string
	// Synthetic is true for the one class of a profile without classes.
	Synthetic bool
}

// Compiled is a validated policy ready for the request path. Classes, Busy
// and Info are parallel: index i of each is the same class, and Resolve
// returns such an index. A Compiled is immutable; share it freely.
type Compiled struct {
	// Classes is what drr.New / SetClasses take.
	Classes []drr.ClassConfig
	// Busy holds each class's busy test.
	Busy []BusyTest
	// Disaggregate holds each class's disaggregation threshold.
	Disaggregate []Disaggregation
	// Info names each class.
	Info []ClassInfo

	root    resolver
	models  map[string]*resolver
	tenants compiledTenants
}

// resolver holds one profile's lookup tables, built once at compile so
// that Resolve only reads maps and slices.
type resolver struct {
	explicit map[string]int // explicit class name -> class index
	families map[string]int // family name -> family number
	// mins are the buckets' lower bounds; byFamily[f*len(mins)+b] is the
	// class index of family f, bucket b.
	mins          []uint64
	byFamily      []int
	defaultFamily int // family number; meaningful when len(mins) > 0
	defaultClass  int // class index for profiles without families
}

// Compile validates c and builds its Compiled form. Classes are numbered
// root profile first, then each model profile in Config order; a profile
// without classes gets the synthetic class.
func (c *Config) Compile() (*Compiled, error) {
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("compile policy: %w", err)
	}
	out := &Compiled{}
	out.root = out.addProfile("", &c.Root)
	if len(c.Models) > 0 {
		out.models = make(map[string]*resolver, len(c.Models))
		for i := range c.Models {
			r := out.addProfile(c.Models[i].Model, &c.Models[i].Profile)
			out.models[c.Models[i].Model] = &r
		}
	}
	out.tenants = compileTenants(c, out.Classes)
	return out, nil
}

// SyntheticClass is the class of a profile without policy classes. It
// never queues: without a policy the picker only picks, so the auto
// default applies to classes a policy writes, not to this one.
func SyntheticClass() Class {
	return Class{Name: SyntheticClassName, QueuePolicy: QueuePolicyFCFS, Quantum: 1, BusyMode: BusyNone}
}

func (out *Compiled) addProfile(model string, p *Profile) resolver {
	classes := p.Classes
	synthetic := len(classes) == 0
	if synthetic {
		classes = []Class{SyntheticClass()}
	}
	base := len(out.Classes)
	r := resolver{explicit: make(map[string]int), families: make(map[string]int)}
	for i := range classes {
		cl := &classes[i]
		out.Classes = append(out.Classes, drrClass(model, cl))
		out.Busy = append(out.Busy, busyTest(cl))
		out.Disaggregate = append(out.Disaggregate, disaggregation(cl))
		out.Info = append(out.Info, ClassInfo{Model: model, Name: cl.Name, Family: cl.Family, Bucket: cl.Bucket, Synthetic: synthetic})
		if cl.Explicit() {
			r.explicit[cl.Name] = base + i
		} else if _, ok := r.families[cl.Family]; !ok {
			r.families[cl.Family] = len(r.families)
		}
	}
	r.defaultClass = base
	if p.DefaultClass != "" {
		for i := range classes {
			if classes[i].Name == p.DefaultClass {
				r.defaultClass = base + i
			}
		}
	}
	if len(r.families) > 0 {
		bucketIdx := make(map[string]int, len(p.Buckets))
		for i, b := range p.Buckets {
			r.mins = append(r.mins, uint64(b.MinTokens))
			bucketIdx[b.Name] = i
		}
		r.byFamily = make([]int, len(r.families)*len(r.mins))
		for i := range classes {
			if cl := &classes[i]; !cl.Explicit() {
				r.byFamily[r.families[cl.Family]*len(r.mins)+bucketIdx[cl.Bucket]] = base + i
			}
		}
		r.defaultFamily = r.families[p.DefaultFamily]
	}
	return r
}

// DRRName is the name a class has in the drr slice: its class name in the
// root profile, "<model>/<class>" in a model profile. Class names cannot
// contain "/", so the last "/" always splits it back.
func DRRName(model, class string) string {
	if model == "" {
		return class
	}
	return model + "/" + class
}

func drrClass(model string, c *Class) drr.ClassConfig {
	pol, err := drr.ParsePolicy(c.QueuePolicy)
	if err != nil {
		pol = drr.EDF // unreachable after Validate
	}
	limit := func(v *int64) uint64 {
		if v == nil {
			return drr.NoLimit
		}
		return uint64(*v)
	}
	return drr.ClassConfig{
		Name:                  DRRName(model, c.Name),
		Quantum:               uint64(c.Quantum),
		Policy:                pol,
		Queueing:              c.Queueing(),
		RequestLimitPerWorker: limit(c.RequestQueueLimitPerWorker),
		RawISLLimitPerWorker:  limit(c.RawISLTokenQueueLimitPerWorker),
		CachedLimitPerWorker:  limit(c.CachedTokenQueueLimitPerWorker),
		WaitBudget:            max(c.MaxQueueWait, time.Duration(0)),
		TenantFairness:        c.TenantFairness,
		MaxTenants:            maxTenants(c),
	}
}

func maxTenants(c *Class) int {
	switch {
	case !c.TenantFairness:
		return 0
	case c.MaxTenants != nil:
		return int(*c.MaxTenants)
	}
	return DefaultMaxTenants
}

// Disaggregation is a class's disaggregate_above_uncached_tokens: when Set,
// a request of the class is disaggregated (prefilled on a prefill pod, in a
// pool that has prefill pods) when its uncached prompt tokens are strictly
// above AboveUncached; unset, the pool's default applies.
type Disaggregation struct {
	AboveUncached uint64
	Set           bool
}

func disaggregation(c *Class) Disaggregation {
	if v := c.DisaggregateAboveUncachedTokens; v != nil && *v >= 0 {
		return Disaggregation{AboveUncached: uint64(*v), Set: true}
	}
	return Disaggregation{}
}

func busyTest(c *Class) BusyTest {
	var b BusyTest
	if c.PrefillBusyThreshold != nil {
		b.Threshold, b.HasThreshold = uint64(*c.PrefillBusyThreshold), true
	}
	if c.PrefillBusyThresholdFrac != nil {
		b.Frac, b.HasFrac = *c.PrefillBusyThresholdFrac, true
	}
	b.Auto = c.BusyAuto()
	if c.BusyWorkerRatio != nil {
		b.Ratio = *c.BusyWorkerRatio
	}
	return b
}

// Resolve returns the index of the physical class of a request (SPEC §2):
// model selects the profile (a model profile for that exact name, else the
// root one), classHeader is the class header's value (trimmed here; "" =
// absent) and uncached the request's uncached prompt tokens. An explicit
// class named by the header wins; otherwise the family is the one the
// header names, or the default family, and the bucket is the last one with
// min_tokens <= uncached. In a profile without families, a request that
// names no explicit class goes to the default class. It never fails and
// does not allocate.
func (c *Compiled) Resolve(model, classHeader string, uncached uint64) int {
	r := &c.root
	if c.models != nil {
		if m, ok := c.models[model]; ok {
			r = m
		}
	}
	h := strings.TrimSpace(classHeader)
	if h != "" {
		if i, ok := r.explicit[h]; ok {
			return i
		}
	}
	n := len(r.mins)
	if n == 0 {
		return r.defaultClass
	}
	fam := r.defaultFamily
	if h != "" {
		if f, ok := r.families[h]; ok {
			fam = f
		}
	}
	// Last bucket with min <= uncached; mins[0] is 0, so b >= 0. Binary
	// search by hand: sort.Search's closure would be an indirect call.
	lo, hi := 0, n // invariant: mins[lo] <= uncached, answer in [lo, hi)
	for hi-lo > 1 {
		mid := int(uint(lo+hi) >> 1)
		if r.mins[mid] <= uncached {
			lo = mid
		} else {
			hi = mid
		}
	}
	return r.byFamily[fam*n+lo]
}

// Index returns the class index of the class named name in the profile of
// model ("" = root), or -1. It is for tests and tools, not the hot path.
func (c *Compiled) Index(model, name string) int {
	for i, in := range c.Info {
		if in.Model == model && in.Name == name {
			return i
		}
	}
	return -1
}

// String summarises a busy test for people: "threshold 1536 tokens",
// "threshold 1.5 × max_num_batched_tokens, ratio 0.5", "threshold auto
// (follows the engine, starts at max_num_batched_tokens)" or "no busy
// threshold (never queues)".
func (b BusyTest) String() string {
	var parts []string
	if b.Auto {
		parts = append(parts, "threshold auto (follows the engine, starts at max_num_batched_tokens)")
	}
	if b.HasThreshold {
		parts = append(parts, fmt.Sprintf("threshold %d tokens", b.Threshold))
	}
	if b.HasFrac {
		parts = append(parts, fmt.Sprintf("threshold %s × max_num_batched_tokens", formatFloat(b.Frac)))
	}
	if len(parts) == 0 {
		return "no busy threshold (never queues)"
	}
	if b.Ratio > 0 && !math.IsNaN(b.Ratio) {
		parts = append(parts, "busy_worker_ratio "+formatFloat(b.Ratio))
	}
	return strings.Join(parts, ", ")
}
