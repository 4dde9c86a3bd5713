package replica

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/pkg/affinity"
	"github.com/laneway-dev/laneway/pkg/drr"
	"github.com/laneway-dev/laneway/pkg/policy"
	"github.com/laneway-dev/laneway/pkg/sched"
	"github.com/laneway-dev/laneway/pkg/sched/schedtest"
)

// TestSparseTicketsDecideAlike runs two cores side by side on the same
// requests: one admits each ticket with its whole chain of block hashes,
// the other the ticket as it came over the link (only the hashes the
// prefix index reads). Every decision must be the same: the cached
// tokens of the cost snapshot, the class they select, the endpoints
// picked, and the index's size on every endpoint after every step. The
// prompts share prefixes of every length, at block sizes that put the
// last cacheable block on and off the sparse grid, on endpoints whose
// small caches evict, with entries that age out.
func TestSparseTicketsDecideAlike(t *testing.T) {
	addrs := []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000"}
	newCore := func() *sched.Core {
		c, err := sched.New(cacheClasses(), sched.Options{
			Chooser: sched.NewCostChooser(2, 7),
			Prefix: &sched.PrefixOptions{BlockSize: 16, Index: affinity.IndexOptions{
				TTL: 30 * time.Second, DefaultCapacity: 64 << 10, // a few long prompts per endpoint
			}},
			MaxFallbacks: 1,
		})
		if err != nil {
			t.Fatal(err)
		}
		eps := make([]sched.Endpoint, len(addrs))
		for i, a := range addrs {
			eps[i] = sched.Endpoint{Addr: a, MaxBatchedTokens: 8192}
		}
		c.SetEndpoints(0, eps)
		c.Drain(0)
		return c
	}
	whole, wire := newCore(), newCore()
	rng := rand.New(rand.NewPCG(1, 2))
	lengths := []int{1, 15, 16, 17, 63 * 16, 64 * 16, 65*16 + 3, 1000, 4096, 4097, 8191, 32 * 1024, 32*1024 + 15, 70000}
	var now int64
	var live [2][]*sched.Grant
	hits := 0 // decisions with cached tokens
	for step := range 3000 {
		now += int64(time.Duration(rng.IntN(200)) * time.Millisecond)
		n := lengths[rng.IntN(len(lengths))]
		bs := []int{16, 16, 16, 1, 7}[rng.IntN(5)]
		tk := schedtest.Ticket().Prompt(n).BlockSize(bs).Base(uint32(rng.IntN(6))).Shared(rng.IntN(n + 1)).Seed(uint32(rng.IntN(40))).Obj()
		var f Frame
		if err := f.Decode((&Frame{Tickets: []Ticket{{ID: uint64(step), T: tk}}}).Append(nil)); err != nil {
			t.Fatal(err)
		}
		sent := f.Tickets[0].T
		var ls [2]sched.Leave
		for i, c := range []*sched.Core{whole, wire} {
			tt := tk
			if i == 1 {
				tt = sent
			}
			r := new(sched.Request)
			r.Reset(tt, nil)
			c.Admit(now, r)
			leaves := c.Drain(now)
			if len(leaves) != 1 {
				t.Fatalf("step %d: %d decisions, want 1 (nothing queues)", step, len(leaves))
			}
			ls[i] = leaves[0]
			if g := leaves[0].Grant; g != nil {
				live[i] = append(live[i], g)
			}
		}
		if tk.Cached != sent.Cached || tk.Class != sent.Class || ls[0].Class != ls[1].Class {
			t.Fatalf("step %d (%d tokens, blocks of %d): cached %d class %s with the whole chain, %d class %s over the link",
				step, n, bs, tk.Cached, ls[0].Class, sent.Cached, ls[1].Class)
		}
		if (ls[0].Grant == nil) != (ls[1].Grant == nil) || ls[0].Grant != nil && !equal(ls[0].Grant.Endpoints, ls[1].Grant.Endpoints) {
			t.Fatalf("step %d: %+v with the whole chain, %+v over the link", step, ls[0].Grant, ls[1].Grant)
		}
		if tk.Cached > 0 {
			hits++
		}
		// Release the oldest grants now and then, alike on both.
		for len(live[0]) > 6 {
			for i, c := range []*sched.Core{whole, wire} {
				c.Release(live[i][0], sched.EventDone)
				live[i] = live[i][1:]
			}
		}
		a, b := whole.Snapshot(), wire.Snapshot()
		for i := range a.Endpoints {
			if a.Endpoints[i].IndexTokens != b.Endpoints[i].IndexTokens {
				t.Fatalf("step %d: %s's index holds %d tokens with whole chains, %d over the link", step, a.Endpoints[i].Addr, a.Endpoints[i].IndexTokens, b.Endpoints[i].IndexTokens)
			}
		}
	}
	if hits < 300 {
		t.Fatalf("only %d of 3000 decisions found cached tokens: the test compared too little", hits)
	}
	t.Logf("%d of 3000 decisions found cached tokens", hits)
}

// cacheClasses is a policy whose class depends on the cached tokens: a
// request with most of its prompt cached goes to class "warm", so the
// cost snapshot's value shows in the class as well as the pick.
func cacheClasses() *sched.Policy {
	cl := func(name string) drr.ClassConfig {
		return drr.ClassConfig{Name: name, Quantum: 100, Policy: drr.FCFS,
			RequestLimitPerWorker: drr.NoLimit, RawISLLimitPerWorker: drr.NoLimit, CachedLimitPerWorker: drr.NoLimit}
	}
	return &sched.Policy{
		Classes: []drr.ClassConfig{cl("cold"), cl("warm")},
		Busy:    []policy.BusyTest{{}, {}},
		Resolve: func(t *sched.Ticket) int {
			if t.Cached > t.RawISL/2 {
				return 1
			}
			return 0
		},
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
