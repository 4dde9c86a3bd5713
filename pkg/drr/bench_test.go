package drr

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
)

// benchProbe: every shared head is Ready; exact lanes on odd endpoints are
// Blocked, the rest Ready.
type benchProbe struct{}

func (benchProbe) Shared(int, *Item) Verdict { return Ready }

func (benchProbe) Lane(_ int, ep EndpointID) Verdict {
	if ep%2 == 1 {
		return Blocked
	}
	return Ready
}

type benchSetup struct {
	classes int
	queued  int
	lanes   int    // exact lanes holding half the queue; 0 = all shared
	cost    uint64 // fixed request cost; 0 = random in [1, 1024]
	quantum uint64
	// mixed gives class i the quantum quantum×(1+i%4); else all equal.
	mixed bool
}

type benchQueue struct {
	s       *Scheduler
	rng     *rand.Rand
	arrival int64
	cfg     benchSetup
	n       int // requests offered
}

func newBenchQueue(b *testing.B, cfg benchSetup) *benchQueue {
	b.Helper()
	cfgs := make([]ClassConfig, cfg.classes)
	for i := range cfgs {
		quantum := cfg.quantum
		if cfg.mixed {
			quantum *= uint64(1 + i%4)
		}
		cfgs[i] = qclass(fmt.Sprintf("c%d", i), quantum, Policy(i%3))
	}
	s, err := New(cfgs)
	if err != nil {
		b.Fatal(err)
	}
	q := &benchQueue{s: s, rng: rand.New(rand.NewPCG(7, 11)), cfg: cfg}
	for i := 0; i < cfg.queued; i++ {
		q.offer(q.request())
	}
	return q
}

// request makes the next fresh request: class round robin, pinned to a
// lane for every other request when lanes are configured.
func (q *benchQueue) request() Request {
	i := q.n
	q.n++
	r := Request{Class: int32(i % q.cfg.classes), Pinned: NoEndpoint, Priority: int32(q.rng.IntN(3))}
	if q.cfg.lanes > 0 && i%2 == 1 {
		r.Pinned = EndpointID((i / 2) % q.cfg.lanes)
	}
	r.RawISL = q.cfg.cost
	if r.RawISL == 0 {
		r.RawISL = 1 + q.rng.Uint64N(1024)
	}
	return r
}

// offer queues r behind everything already queued.
func (q *benchQueue) offer(r Request) *Item {
	q.arrival += 1000
	r.Arrival = q.arrival
	it, err := q.s.Offer(r, Tenant{}, 1, true)
	if err != nil || it == nil {
		panic(fmt.Sprintf("benchmark offer: %v, %v", it, err))
	}
	return it
}

// popBatch pops up to n items, timed by the caller's timer, and returns
// their requests for an untimed re-offer.
func (q *benchQueue) popBatch(b *testing.B, n int, buf []Request) []Request {
	for j := 0; j < n; j++ {
		it, out := q.s.Pop(0, benchProbe{})
		if out != Dispatch {
			b.Fatalf("Pop outcome %v with %d queued", out, q.s.Len())
		}
		buf = append(buf, it.Request)
	}
	return buf
}

// benchPop measures one Pop per op. The queue is kept near its size: every
// batch of pops (at most 1/8 of the queue) is re-offered with the timer
// stopped, so the measured op is a Pop alone.
func benchPop(b *testing.B, cfg benchSetup) {
	q := newBenchQueue(b, cfg)
	batch := min(256, max(1, cfg.queued/8))
	buf := make([]Request, 0, batch)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; {
		n := min(batch, b.N-i)
		buf = q.popBatch(b, n, buf[:0])
		i += n
		b.StopTimer()
		for _, r := range buf {
			q.offer(r)
		}
		b.StartTimer()
	}
}

func BenchmarkPop(b *testing.B) {
	for _, classes := range []int{1, 8, 64} {
		for _, queued := range []int{1_000, 100_000} {
			for _, lanes := range []int{0, 1_000, 10_000} {
				if lanes > queued/2 {
					continue // not enough pinned requests to fill the lanes
				}
				name := fmt.Sprintf("classes=%d/queued=%d/lanes=%d", classes, queued, lanes)
				b.Run(name, func(b *testing.B) {
					benchPop(b, benchSetup{classes: classes, queued: queued, lanes: lanes, quantum: 512, mixed: true})
				})
			}
		}
	}
}

// BenchmarkPopCost: bulk credit makes a cost of 10^9 at quantum 1 cost
// about the same as a cost of 1. With mixed quanta (1..4) most calls of the
// 10^9 case need a full ring scan plus bulk rounds: O(C), not O(cost).
func BenchmarkPopCost(b *testing.B) {
	for _, mixed := range []bool{false, true} {
		for _, cost := range []uint64{1, 1_000_000_000} {
			quanta := "1"
			if mixed {
				quanta = "1..4"
			}
			b.Run(fmt.Sprintf("cost=%d/quantum=%s", cost, quanta), func(b *testing.B) {
				benchPop(b, benchSetup{classes: 8, queued: 1_000, cost: cost, quantum: 1, mixed: mixed})
			})
		}
	}
}

// BenchmarkPopEndpointChanged: one Pop plus the EndpointChanged the
// dispatcher reports after charging the endpoint of a pinned dispatch, so
// that lane is probed again on its next turn.
func BenchmarkPopEndpointChanged(b *testing.B) {
	cfg := benchSetup{classes: 8, queued: 100_000, lanes: 10_000, quantum: 512, mixed: true}
	q := newBenchQueue(b, cfg)
	const batch = 256
	buf := make([]Request, 0, batch)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; {
		n := min(batch, b.N-i)
		buf = buf[:0]
		for j := 0; j < n; j++ {
			it, out := q.s.Pop(0, benchProbe{})
			if out != Dispatch {
				b.Fatalf("Pop outcome %v", out)
			}
			if it.Pinned != NoEndpoint {
				q.s.EndpointChanged(it.Pinned)
			}
			buf = append(buf, it.Request)
		}
		i += n
		b.StopTimer()
		for _, r := range buf {
			q.offer(r)
		}
		b.StartTimer()
	}
}

// BenchmarkOffer measures one Offer (enqueue) into 8 classes holding about
// 100k requests; each batch is removed again with the timer stopped.
func BenchmarkOffer(b *testing.B) {
	for _, lanes := range []int{0, 10_000} {
		b.Run(fmt.Sprintf("lanes=%d", lanes), func(b *testing.B) {
			q := newBenchQueue(b, benchSetup{classes: 8, queued: 100_000, lanes: lanes, quantum: 512, mixed: true})
			const batch = 256
			reqs := make([]Request, batch)
			items := make([]*Item, 0, batch)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; {
				n := min(batch, b.N-i)
				b.StopTimer()
				for j := 0; j < n; j++ {
					reqs[j] = q.request()
					q.arrival += 1000
					reqs[j].Arrival = q.arrival
				}
				items = items[:0]
				b.StartTimer()
				for j := 0; j < n; j++ {
					it, _ := q.s.Offer(reqs[j], Tenant{}, 1, true)
					items = append(items, it)
				}
				i += n
				b.StopTimer()
				for _, it := range items {
					if !q.s.Remove(it) {
						b.Fatal("offered item was not queued")
					}
				}
				b.StartTimer()
			}
		})
	}
}

// BenchmarkRemove measures one Remove of a random queued item (client gone)
// from 8 classes holding about 100k requests; removed requests are offered
// again with the timer stopped.
func BenchmarkRemove(b *testing.B) {
	for _, lanes := range []int{0, 10_000} {
		b.Run(fmt.Sprintf("lanes=%d", lanes), func(b *testing.B) {
			q := newBenchQueue(b, benchSetup{classes: 8, queued: 100_000, lanes: lanes, quantum: 512, mixed: true})
			live := q.s.all()
			const batch = 256
			victims := make([]*Item, 0, batch)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; {
				n := min(batch, b.N-i)
				b.StopTimer()
				victims = victims[:0]
				for j := 0; j < n; j++ {
					k := q.rng.IntN(len(live))
					victims = append(victims, live[k])
					live[k] = live[len(live)-1]
					live = live[:len(live)-1]
				}
				b.StartTimer()
				for _, it := range victims {
					if !q.s.Remove(it) {
						b.Fatal("Remove of a queued item = false")
					}
				}
				i += n
				b.StopTimer()
				for _, it := range victims {
					live = append(live, q.offer(it.Request))
				}
				b.StartTimer()
			}
		})
	}
}

// BenchmarkMemoryPerRequest reports the heap the scheduler retains per
// queued request (the caller's payload excluded: it is nil here), as B/req.
func BenchmarkMemoryPerRequest(b *testing.B) {
	const n = 100_000
	for _, lanes := range []int{0, 10_000} {
		b.Run(fmt.Sprintf("queued=%d/lanes=%d", n, lanes), func(b *testing.B) {
			var perReq float64
			for i := 0; i < b.N; i++ {
				var m0, m1 runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&m0)
				q := newBenchQueue(b, benchSetup{classes: 8, queued: n, lanes: lanes, quantum: 512})
				q.rng = nil
				runtime.GC()
				runtime.ReadMemStats(&m1)
				if q.s.Len() != n {
					b.Fatalf("Len = %d", q.s.Len())
				}
				perReq = float64(int64(m1.HeapAlloc)-int64(m0.HeapAlloc)) / n
				runtime.KeepAlive(q)
			}
			b.ReportMetric(perReq, "B/req")
		})
	}
}

// BenchmarkTenantPop is one Pop from a tenant-fair class whose queue holds
// one request for each of T tenants (the shape of many small callers), or
// for T = 1 a queue of 10,000 requests of one tenant: the tenant DRR's
// O(log T) on top of the class ring. Popped requests are offered again
// with the timer stopped, each for the tenant it came from.
func BenchmarkTenantPop(b *testing.B) {
	for _, tenants := range []int{1, 100, 10_000} {
		b.Run(fmt.Sprintf("tenants=%d", tenants), func(b *testing.B) {
			s, err := New([]ClassConfig{func() ClassConfig { c := qclass("c", 512, FCFS); c.TenantFairness = true; return c }()})
			if err != nil {
				b.Fatal(err)
			}
			names := make([]string, tenants)
			for i := range names {
				names[i] = fmt.Sprintf("tenant-%05d", i)
			}
			rng := rand.New(rand.NewPCG(3, 9))
			var arrival int64
			offer := func(name string) {
				arrival++
				r := Request{Pinned: NoEndpoint, RawISL: 1 + rng.Uint64N(1024), Arrival: arrival, Payload: name}
				if _, err := s.Offer(r, Tenant{Name: name, Weight: 1 + uint64(len(name)%3)}, 1, true); err != nil {
					b.Fatal(err)
				}
			}
			for i := range max(tenants, 10_000) {
				offer(names[i%tenants])
			}
			batch := 256
			popped := make([]string, 0, batch)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; {
				n := min(batch, b.N-i)
				for range n {
					it, out := s.Pop(0, benchProbe{})
					if out != Dispatch {
						b.Fatalf("Pop outcome %v", out)
					}
					popped = append(popped, it.Payload.(string))
				}
				i += n
				b.StopTimer()
				for _, name := range popped {
					offer(name)
				}
				popped = popped[:0]
				b.StartTimer()
			}
		})
	}
}

// BenchmarkTenantChurn is one Offer and one Pop, timed together, in a
// tenant-fair class holding one request for each of 1,000 tenants: every
// pop empties a tenant and every offer brings one back, the churn of many
// callers with one request each (BenchmarkTenantPop times the Pop alone).
func BenchmarkTenantChurn(b *testing.B) {
	s, err := New([]ClassConfig{func() ClassConfig { c := qclass("c", 512, FCFS); c.TenantFairness = true; return c }()})
	if err != nil {
		b.Fatal(err)
	}
	const tenants = 1000
	names := make([]string, tenants)
	for i := range names {
		names[i] = fmt.Sprintf("tenant-%05d", i)
	}
	var arrival int64
	offer := func(name string) {
		arrival++
		r := Request{Pinned: NoEndpoint, RawISL: 256, Arrival: arrival, Payload: name}
		if _, err := s.Offer(r, Tenant{Name: name, Weight: 1}, 1, true); err != nil {
			b.Fatal(err)
		}
	}
	for _, n := range names {
		offer(n)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		it, out := s.Pop(0, benchProbe{})
		if out != Dispatch {
			b.Fatalf("Pop outcome %v", out)
		}
		offer(it.Payload.(string))
	}
}

// BenchmarkMemoryPerTenant reports what an active tenant costs beyond its
// requests: 10,000 requests queued for 10,000 tenants against the same
// requests for one tenant, in a tenant-fair class.
func BenchmarkMemoryPerTenant(b *testing.B) {
	const n = 10_000
	heap := func(tenants int) float64 {
		var m0, m1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		c := qclass("c", 512, FCFS)
		c.TenantFairness = true
		s, err := New([]ClassConfig{c})
		if err != nil {
			b.Fatal(err)
		}
		names := make([]string, tenants)
		for i := range names {
			names[i] = fmt.Sprintf("tenant-%05d", i) // the caller holds the names either way
		}
		runtime.GC()
		runtime.ReadMemStats(&m0)
		for i := range n {
			if _, err := s.Offer(Request{Pinned: NoEndpoint, RawISL: 100, Arrival: int64(i)}, Tenant{Name: names[i%tenants]}, 1, true); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&m1)
		runtime.KeepAlive(s)
		runtime.KeepAlive(names)
		return float64(int64(m1.HeapAlloc) - int64(m0.HeapAlloc))
	}
	var perTenant float64
	for range b.N {
		perTenant = (heap(n) - heap(1)) / (n - 1)
	}
	b.ReportMetric(perTenant, "B/tenant")
}
