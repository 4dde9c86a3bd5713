package drr

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// fairClass is a tenant-fair fcfs class with quantum q.
func fairClass(name string, q uint64) ClassConfig {
	c := qclass(name, q, FCFS)
	c.TenantFairness = true
	return c
}

// offerTenant queues a request of the given cost for tenant t (weight w)
// as if every endpoint were busy.
func offerTenant(t testing.TB, s *Scheduler, class int, tenant string, w, cost uint64, arrival int64) *Item {
	t.Helper()
	it, err := s.Offer(Request{Class: int32(class), Pinned: NoEndpoint, RawISL: cost, Arrival: arrival, Payload: tenant},
		Tenant{Name: tenant, Weight: w}, 1, true)
	if err != nil || it == nil {
		t.Fatalf("Offer(%s, cost %d) = %v, %v; want a queued item", tenant, cost, it, err)
	}
	return it
}

// TestTenantsShareByTokens: inside one tenant-fair class, a tenant flooding
// long prompts and one sending short ones, equal weights, both backlogged,
// are served equal tokens (request round robin would serve 8:1).
func TestTenantsShareByTokens(t *testing.T) {
	s := mustNew(t, fairClass("regular", 512))
	var arrival int64
	for range 400 {
		arrival++
		offerTenant(t, s, 0, "a", 1, 2048, arrival)
		arrival++
		offerTenant(t, s, 0, "b", 1, 256, arrival)
	}
	served := map[string]uint64{}
	for range 300 {
		it, out := s.Pop(0, newProbe())
		if out != Dispatch {
			t.Fatalf("outcome %v", out)
		}
		served[it.Payload.(string)] += it.Cost()
	}
	if r := float64(served["a"]) / float64(served["b"]); r < 0.95 || r > 1.05 {
		t.Fatalf("served tokens a:b = %d:%d (%.3f), want 1 within 5%%", served["a"], served["b"], r)
	}
}

// TestHugeCostDoesNotWrapTheRound: a newcomer whose head costs near 2^64
// with quantum 1 is affordable only after that many rounds; the round
// saturates instead of wrapping to one in the past, which would serve it
// first with near-unlimited credit.
func TestHugeCostDoesNotWrapTheRound(t *testing.T) {
	s := mustNew(t, fairClass("regular", 1))
	// Rounds go by while a tenant stays backlogged: the newcomers join in
	// round 5, so a wrapped round would come before it.
	for i := range 10 {
		offerTenant(t, s, 0, "warm", 1, 1, int64(i))
	}
	for range 5 {
		if _, out := s.Pop(0, newProbe()); out != Dispatch {
			t.Fatalf("warm-up pop: %v", out)
		}
	}
	offerTenant(t, s, 0, "huge", 1, 1<<64-1, 10)
	offerTenant(t, s, 0, "small", 1, 1, 11)
	it, out := s.Pop(0, newProbe())
	if out != Dispatch || it.Payload.(string) != "small" {
		t.Fatalf("first pop: %v %v, want tenant small's request", out, it.Payload)
	}
}

// TestTenantWeights: weights 3:1 with equal costs serve requests 3:1, in
// the exact DRR pattern.
func TestTenantWeights(t *testing.T) {
	s := mustNew(t, fairClass("regular", 100))
	for i := range 40 {
		offerTenant(t, s, 0, "heavy", 3, 100, int64(2*i))
		offerTenant(t, s, 0, "light", 1, 100, int64(2*i+1))
	}
	var got []string
	for range 16 {
		it, _ := s.Pop(0, newProbe())
		got = append(got, it.Payload.(string))
	}
	var want []string
	for range 4 {
		want = append(want, "heavy", "heavy", "heavy", "light")
	}
	if !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

// TestFloodDoesNotStarveOthers is the flood case: one tenant's 600 queued
// requests do not hold back another's 60 (FCFS would serve them last).
func TestFloodDoesNotStarveOthers(t *testing.T) {
	s := mustNew(t, fairClass("regular", 512))
	var arrival int64
	for i := range 600 {
		arrival++
		offerTenant(t, s, 0, "flood", 1, 512, arrival)
		if i%10 == 0 {
			arrival++
			offerTenant(t, s, 0, "small", 1, 512, arrival)
		}
	}
	small := 0
	for n := 1; small < 60; n++ {
		it, _ := s.Pop(0, newProbe())
		if it.Payload.(string) == "small" {
			small++
		}
		if n > 121 {
			t.Fatalf("small tenant has %d of 60 served after %d pops, want all 60 within 120", small, n)
		}
	}
}

// TestStrictTierGoesFirstAcrossTenants: a tenant whose head has a higher
// strict tier is served before the others whatever their credit.
func TestStrictTierGoesFirstAcrossTenants(t *testing.T) {
	s := mustNew(t, fairClass("c", 10))
	for i := range 5 {
		offerTenant(t, s, 0, "a", 1, 10, int64(i))
	}
	it, _ := s.Offer(Request{Class: 0, Pinned: NoEndpoint, RawISL: 500, StrictPriority: 2, Arrival: 9, Payload: "vip"},
		Tenant{Name: "vip"}, 1, true)
	if it == nil {
		t.Fatal("vip request not queued")
	}
	got, _ := s.Pop(0, newProbe())
	if got.Payload.(string) != "vip" {
		t.Fatalf("first pop %v, want the strict-tier tenant", got.Payload)
	}
}

// TestEmptyTenantHoldsNothing: a tenant whose last request leaves holds no
// state, and the class counts active tenants exactly.
func TestEmptyTenantHoldsNothing(t *testing.T) {
	s := mustNew(t, fairClass("c", 10))
	a := offerTenant(t, s, 0, "a", 1, 7, 1)
	offerTenant(t, s, 0, "b", 1, 7, 2)
	if n := s.Stats()[0].Tenants; n != 2 {
		t.Fatalf("tenants = %d, want 2", n)
	}
	s.Remove(a)
	c := s.classes[0]
	if n := s.Stats()[0].Tenants; n != 1 || c.tenants["a"] != nil || c.tq.Len() != 1 {
		t.Fatalf("after a left: %d tenants, a = %v, heap %d; want only b", n, c.tenants["a"], c.tq.Len())
	}
	s.Pop(0, newProbe())
	if len(c.tenants) != 0 || c.tq.Len() != 0 || len(c.rounds) != 0 {
		t.Fatalf("empty class keeps %d tenants, heap %d, %d cursors", len(c.tenants), c.tq.Len(), len(c.rounds))
	}
}

// TestTenantLimits: a tenant's own limits and the class's tenant bound
// reject with the numbers and the tenant's name.
func TestTenantLimits(t *testing.T) {
	cfg := fairClass("c", 10)
	cfg.MaxTenants = 2
	s := mustNew(t, cfg)
	spec := Tenant{Name: "a", RequestLimit: 2, RawISLLimit: 1000}
	offer := func(spec Tenant, cost uint64) error {
		_, err := s.Offer(Request{Pinned: NoEndpoint, RawISL: cost}, spec, 1, true)
		return err
	}
	for range 2 {
		if err := offer(spec, 100); err != nil {
			t.Fatal(err)
		}
	}
	var rej *Rejection
	if err := offer(spec, 100); !errors.As(err, &rej) || *rej != (Rejection{Class: "c", Tenant: "a", Kind: LimitRequests, Current: 2, Limit: 2}) {
		t.Fatalf("third request of a: %v, want its request limit", err)
	}
	if err := offer(Tenant{Name: "b", RawISLLimit: 150}, 100); err != nil {
		t.Fatal(err)
	}
	if err := offer(Tenant{Name: "b", RawISLLimit: 150}, 100); err != nil {
		t.Fatal(err) // 100 < 150 before adding
	}
	if err := offer(Tenant{Name: "b", RawISLLimit: 150}, 1); !errors.As(err, &rej) || rej.Kind != LimitRawISLTokens || rej.Current != 200 || rej.Tenant != "b" {
		t.Fatalf("b past its token limit: %v", err)
	}
	if err := offer(Tenant{Name: "c"}, 1); !errors.As(err, &rej) || *rej != (Rejection{Class: "c", Tenant: "c", Kind: LimitTenants, Current: 2, Limit: 2}) {
		t.Fatalf("a third tenant: %v, want the tenant bound", err)
	}
	if got := rej.Error(); got != `policy class "c" tenant limit reached: 2 tenants queued >= limit 2 (tenant "c" is not queued yet)` {
		t.Fatalf("message %q", got)
	}
}

// TestSetClassesKeepsTenants: a policy swap keeps every tenant's queue and
// order, and may change a tenant's weight.
func TestSetClassesKeepsTenants(t *testing.T) {
	s := mustNew(t, fairClass("c", 100))
	for i := range 8 {
		offerTenant(t, s, 0, "x", 1, 100, int64(2*i))
		offerTenant(t, s, 0, "y", 1, 100, int64(2*i+1))
	}
	err := s.SetClasses([]ClassConfig{fairClass("c", 100)}, func(it *Item) (int, Tenant) {
		ten := it.Tenant()
		if ten.Name == "x" {
			ten.Weight = 3
		}
		return 0, ten
	})
	if err != nil {
		t.Fatal(err)
	}
	if s.Len() != 16 || s.Stats()[0].Tenants != 2 {
		t.Fatalf("after the swap: %d queued, %d tenants", s.Len(), s.Stats()[0].Tenants)
	}
	var got []string
	for range 8 {
		it, _ := s.Pop(0, newProbe())
		got = append(got, it.Payload.(string))
	}
	if want := []string{"x", "x", "x", "y", "x", "x", "x", "y"}; !slices.Equal(got, want) {
		t.Fatalf("order after reweighting %v, want %v", got, want)
	}
}

// refTenantDRR is the reference for FuzzTenantDRR: literal round-robin
// DRR over a ring of tenants, one visit at a time, no bulk rounds. Rounds
// run in ring order; a tenant that becomes backlogged is appended to the
// ring; the cursor stays on a tenant while its next head is affordable.
type refTenantDRR struct {
	quantum uint64
	ring    []*refTenant
	next    int        // ring index of the next visit in this round
	cur     *refTenant // the tenant in its visit, if any
}

type refTenant struct {
	name   string
	weight uint64
	credit uint64
	queue  []refReq
}

type refReq struct {
	id   int
	cost uint64
}

func (r *refTenantDRR) find(name string) int {
	return slices.IndexFunc(r.ring, func(t *refTenant) bool { return t.name == name })
}

func (r *refTenantDRR) offer(name string, weight uint64, req refReq) {
	i := r.find(name)
	if i < 0 {
		r.ring = append(r.ring, &refTenant{name: name, weight: weight})
		i = len(r.ring) - 1
	}
	r.ring[i].queue = append(r.ring[i].queue, req)
}

func (r *refTenantDRR) remove(id int) {
	for i, t := range r.ring {
		for j, q := range t.queue {
			if q.id == id {
				t.queue = slices.Delete(t.queue, j, j+1)
				if len(t.queue) == 0 {
					r.drop(i)
				}
				return
			}
		}
	}
}

// drop removes the empty tenant at ring index i; the next visit moves up
// with the ring.
func (r *refTenantDRR) drop(i int) {
	if r.cur == r.ring[i] {
		r.cur = nil
	}
	r.ring = slices.Delete(r.ring, i, i+1)
	if i < r.next {
		r.next--
	}
	if len(r.ring) == 0 {
		r.next = 0
	}
}

func (r *refTenantDRR) pop() int {
	if len(r.ring) == 0 {
		return -1
	}
	if t := r.cur; t != nil {
		if t.credit >= t.queue[0].cost {
			return r.serve(t)
		}
		r.cur = nil // its visit is over
	}
	for {
		if r.next >= len(r.ring) {
			r.next = 0 // a new round
		}
		t := r.ring[r.next]
		t.credit += r.quantum * t.weight
		if t.credit >= t.queue[0].cost {
			return r.serve(t)
		}
		r.next++
	}
}

func (r *refTenantDRR) serve(t *refTenant) int {
	i := slices.Index(r.ring, t)
	q := t.queue[0]
	t.queue = t.queue[1:]
	t.credit -= q.cost
	r.next = i + 1
	r.cur = nil
	switch {
	case len(t.queue) == 0:
		r.drop(i)
	case t.credit >= t.queue[0].cost:
		r.cur = t // the cursor stays: the tenant spends its burst
	}
	return q.id
}

// FuzzTenantDRR checks the tenant DRR, heap-ordered in O(log T), against
// the literal round-robin reference: the same request leaves at every pop,
// whatever the offers, weights, costs and removals. It also checks the
// share itself: over any stretch in which the same tenants stay
// backlogged, the service of each two, in rounds of their own quantum
// (class quantum × weight), differs by at most one round plus one maximum
// request cost each (and the quantum each may carry in or out).
func FuzzTenantDRR(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	rng := rand.New(rand.NewPCG(5, 6))
	for range 8 {
		b := make([]byte, 32+rng.IntN(512))
		for i := range b {
			b[i] = byte(rng.UintN(256))
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &fzReader{b: data}
		quantum := 1 + uint64(r.next()%64)
		s := mustNew(t, fairClass("c", quantum))
		ref := &refTenantDRR{quantum: quantum}
		weights := map[string]uint64{}
		items := map[int]*Item{}
		var arrival int64
		id := 0
		// The share check: service per tenant since the backlogged set
		// last changed, and the largest cost each has had queued since.
		served := map[string]uint64{}
		maxCost := map[string]uint64{}
		backlogged := func() string {
			var names []string
			for _, rt := range ref.ring {
				names = append(names, rt.name)
			}
			return fmt.Sprint(names)
		}
		window := ""
		for step := 0; r.more() && step < 2000; step++ {
			if b := backlogged(); b != window {
				window = b
				clear(served)
				clear(maxCost)
			}
			for _, rt := range ref.ring {
				for _, q := range rt.queue {
					maxCost[rt.name] = max(maxCost[rt.name], q.cost)
				}
			}
			switch op := r.next() % 8; {
			case op < 4: // offer
				name := fmt.Sprintf("t%d", r.next()%6)
				w, ok := weights[name]
				if !ok {
					w = 1 + uint64(r.next()%4)
					weights[name] = w
				}
				cost := 1 + uint64(r.next())*uint64(1+r.next()%4)
				arrival++
				id++
				it, err := s.Offer(Request{Pinned: NoEndpoint, RawISL: cost, Arrival: arrival, Payload: id},
					Tenant{Name: name, Weight: w}, 1, true)
				if err != nil || it == nil {
					t.Fatalf("offer: %v %v", it, err)
				}
				items[id] = it
				ref.offer(name, w, refReq{id: id, cost: cost})
			case op < 7: // pop
				want := ref.pop()
				it, out := s.Pop(0, newProbe())
				if want < 0 {
					if out != None {
						t.Fatalf("step %d: scheduler popped %v, reference has nothing", step, out)
					}
					continue
				}
				if out != Dispatch || it.Payload.(int) != want {
					got := -1
					if it != nil {
						got = it.Payload.(int)
					}
					t.Fatalf("step %d: popped request %d (%v), reference serves %d", step, got, out, want)
				}
				delete(items, want)
				name := it.Tenant().Name
				served[name] += it.Cost()
				maxCost[name] = max(maxCost[name], it.Cost())
				if backlogged() == window { // the set held through this pop
					for _, a := range ref.ring {
						for _, b := range ref.ring {
							qa, qb := float64(quantum*a.weight), float64(quantum*b.weight)
							gap := float64(served[a.name])/qa - float64(served[b.name])/qb
							bound := 3 + float64(maxCost[a.name])/qa + float64(maxCost[b.name])/qb
							if gap > bound {
								t.Fatalf("step %d: %s served %d (%.1f rounds), %s %d (%.1f rounds): apart by more than %.1f",
									step, a.name, served[a.name], float64(served[a.name])/qa, b.name, served[b.name], float64(served[b.name])/qb, bound)
							}
						}
					}
				}
			default: // remove a queued request
				if len(items) == 0 {
					continue
				}
				ids := make([]int, 0, len(items))
				for k := range items {
					ids = append(ids, k)
				}
				slices.Sort(ids)
				k := ids[int(r.next())%len(ids)]
				s.Remove(items[k])
				delete(items, k)
				ref.remove(k)
			}
			if s.Stats()[0].Tenants != len(ref.ring) {
				t.Fatalf("step %d: %d tenants, reference %d", step, s.Stats()[0].Tenants, len(ref.ring))
			}
		}
	})
}
