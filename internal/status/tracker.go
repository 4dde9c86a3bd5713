package status

import (
	"cmp"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/laneway-dev/laneway/pkg/sched"
)

// Window is how far back the Tracker looks.
const Window = time.Minute

// Tracker records the picker's decisions for the status page. Decided runs
// on the dispatcher's loop; reads come from HTTP handlers and scrapes.
//
// The loop must never wait long for a reader: a reader holds the lock
// only to take a snapshot, pointers to the window's seconds and a copy of
// the one second the loop still writes, and sums up outside it. That
// works because a second is written only while it is the latest one
// Decided saw (last): a new second gets a new bucket, never a cleared
// old one, so every other bucket is immutable once a reader holds it.
// The snapshot thus costs O(classes × 60) plus the tenants of the current
// second, however many tenants the minute had.
type Tracker struct {
	mu      sync.Mutex
	now     func() time.Time
	classes map[string]*classWindow
	last    int64 // the latest unix second Decided wrote: the only one still written

	// readHook, when set (tests), runs in every read once the snapshot is
	// taken and the lock let go.
	readHook func()
}

// classWindow is one class's last minute, one bucket per second (a ring
// indexed by the second modulo its length; nil is empty).
type classWindow struct {
	secs [windowSecs]*second
}

const windowSecs = int(Window / time.Second)

// second is one second of one class's decisions.
type second struct {
	at         int64 // unix second the bucket holds
	dispatched uint64
	rejected   uint64
	waits      hist
	// served is uncached tokens granted per tenant; backlogged the tenants
	// with a queued grant; weight the tenant's DRR weight.
	served     map[string]uint64
	backlogged map[string]bool
	weight     map[string]uint64
}

// NewTracker returns an empty tracker reading the wall clock.
func NewTracker() *Tracker { return newTracker(time.Now) }

func newTracker(now func() time.Time) *Tracker {
	return &Tracker{now: now, classes: map[string]*classWindow{}}
}

// Decided takes one decision of the scheduling core (a dispatcher
// Observer).
func (t *Tracker) Decided(l *sched.Leave) {
	at := t.now().Unix()
	t.mu.Lock()
	defer t.mu.Unlock()
	// A clock that steps back writes into the latest second: the ones
	// before it are immutable (see Tracker).
	at = max(at, t.last)
	t.last = at
	cw := t.classes[l.Class]
	if cw == nil {
		cw = &classWindow{}
		t.classes[l.Class] = cw
	}
	idx := at % int64(windowSecs)
	s := cw.secs[idx]
	if s == nil || s.at != at {
		s = &second{at: at}
		cw.secs[idx] = s
	}
	if l.Grant == nil {
		s.rejected++
		return
	}
	s.dispatched++
	if l.Queued {
		s.waits.add(l.Wait)
	}
	if l.Tenant == "" {
		return
	}
	if s.served == nil {
		s.served, s.backlogged, s.weight = map[string]uint64{}, map[string]bool{}, map[string]uint64{}
	}
	s.served[l.Tenant] += l.Uncached
	s.weight[l.Tenant] = l.Weight
	if l.Queued {
		s.backlogged[l.Tenant] = true
	}
}

// clone copies a second the loop may still write.
func (s *second) clone() *second {
	c := *s
	c.served, c.backlogged, c.weight = maps.Clone(s.served), maps.Clone(s.backlogged), maps.Clone(s.weight)
	return &c
}

// snapshot returns class name's seconds as they are now, safe to read
// without the lock (see Tracker); ok is false for a class without any.
func (t *Tracker) snapshot(name string) (secs [windowSecs]*second, ok bool) {
	t.mu.Lock()
	cw := t.classes[name]
	if cw != nil {
		secs = cw.secs
		for i, s := range secs {
			if s != nil && s.at == t.last {
				secs[i] = s.clone()
			}
		}
	}
	t.mu.Unlock()
	if t.readHook != nil {
		t.readHook()
	}
	return secs, cw != nil
}

// ClassWindow is one class's last minute as the status page shows it.
type ClassWindow struct {
	Dispatched uint64
	Rejected   uint64
	// WaitP50 and WaitP99 are queue-wait percentiles of the queued grants
	// (0 when none waited); upper bounds of their histogram bucket.
	WaitP50, WaitP99 time.Duration
	// Served is uncached tokens granted per tenant, most first.
	Served []TenantTokens
	// Jain is Jain's fairness index over the weight-normalised uncached
	// tokens served to the tenants that were backlogged (had a queued
	// grant) in the window: 1 when each got its weight's share, 1/n when
	// one got everything. NaN when fewer than two tenants were backlogged.
	Jain float64
	// Backlogged is how many tenants that index is over.
	Backlogged int
}

// TenantTokens is a tenant and a token count.
type TenantTokens struct {
	Tenant string
	Tokens uint64
}

// Class returns class name's last minute. The sums are made outside the
// lock the dispatcher's loop takes (see Tracker).
func (t *Tracker) Class(name string) ClassWindow {
	var out ClassWindow
	secs, ok := t.snapshot(name)
	if !ok {
		out.Jain = math.NaN()
		return out
	}
	cutoff := t.now().Unix() - int64(windowSecs)
	var h hist
	served := map[string]uint64{}
	weight := map[string]uint64{}
	backlogged := map[string]bool{}
	for _, s := range secs {
		if s == nil || s.at <= cutoff {
			continue
		}
		out.Dispatched += s.dispatched
		out.Rejected += s.rejected
		h.merge(&s.waits)
		for k, v := range s.served {
			served[k] += v
			weight[k] = s.weight[k]
		}
		for k := range s.backlogged {
			backlogged[k] = true
		}
	}
	out.WaitP50, out.WaitP99 = h.quantile(0.5), h.quantile(0.99)
	for k, v := range served {
		out.Served = append(out.Served, TenantTokens{k, v})
	}
	slices.SortFunc(out.Served, func(a, b TenantTokens) int {
		if a.Tokens != b.Tokens {
			return cmp.Compare(b.Tokens, a.Tokens)
		}
		return cmp.Compare(a.Tenant, b.Tenant)
	})
	var xs []float64
	for k := range backlogged {
		xs = append(xs, float64(served[k])/float64(max(weight[k], 1)))
	}
	out.Backlogged = len(xs)
	out.Jain = Jain(xs)
	return out
}

// Classes lists the classes with decisions in the tracker.
func (t *Tracker) Classes() []string {
	t.mu.Lock()
	names := make([]string, 0, len(t.classes))
	for k := range t.classes {
		names = append(names, k)
	}
	t.mu.Unlock()
	slices.Sort(names)
	return names
}

// Jain is Jain's fairness index of xs, (Σx)² / (n·Σx²): 1 for equal
// values, 1/n when one value holds everything. NaN for fewer than two
// values or all zero.
func Jain(xs []float64) float64 {
	if len(xs) < 2 {
		return math.NaN()
	}
	var sum, sq float64
	for _, x := range xs {
		sum += x
		sq += x * x
	}
	if sq == 0 {
		return math.NaN()
	}
	return sum * sum / (float64(len(xs)) * sq)
}

// hist is a queue-wait histogram with power-of-two millisecond buckets:
// bucket i counts waits up to 2^i ms (bucket 0: up to 1 ms); the last one
// everything longer.
type hist struct{ n [24]uint64 }

func (h *hist) add(d time.Duration) {
	ms := d.Milliseconds()
	i := 0
	for i < len(h.n)-1 && ms > int64(1)<<i {
		i++
	}
	h.n[i]++
}

func (h *hist) merge(o *hist) {
	for i, v := range o.n {
		h.n[i] += v
	}
}

// quantile returns the upper bound of the bucket holding quantile q (0
// when empty).
func (h *hist) quantile(q float64) time.Duration {
	var total uint64
	for _, v := range h.n {
		total += v
	}
	if total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(total)))
	var seen uint64
	for i, v := range h.n {
		seen += v
		if seen >= rank {
			return time.Duration(int64(1)<<i) * time.Millisecond
		}
	}
	return time.Duration(int64(1)<<(len(h.n)-1)) * time.Millisecond
}
