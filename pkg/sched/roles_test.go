package sched

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/laneway-dev/laneway/pkg/podmetrics"
	"github.com/laneway-dev/laneway/pkg/policy"
)

func TestParseRole(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Role
		err  bool
	}{
		{"", RolePrefillDecode, false},
		{"prefill", RolePrefill, false},
		{" Decode ", RoleDecode, false},
		{"prefill-decode", RolePrefillDecode, false},
		{"both", RolePrefillDecode, false},
		{"BOTH", RolePrefillDecode, false},
		{"prefil", RolePrefillDecode, true},
	} {
		got, err := ParseRole(tc.in)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("ParseRole(%q) = %v, %v; want %v, error %t", tc.in, got, err, tc.want, tc.err)
		}
	}
	for _, r := range []Role{RolePrefill, RoleDecode, RolePrefillDecode} {
		if back, err := ParseRole(r.String()); err != nil || back != r {
			t.Errorf("ParseRole(%q) = %v, %v", r.String(), back, err)
		}
	}
}

// Addresses of the P/D pools of these tests: two prefill pods, two decode
// pods and one prefill-decode pod (used by some).
const (
	pdP1, pdP2 = "10.1.0.1:8000", "10.1.0.2:8000"
	pdD1, pdD2 = "10.2.0.1:8000", "10.2.0.2:8000"
	pdPD       = "10.3.0.1:8000"
)

// pdCore is a core over the P/D pool of roles (address → role), with a
// queueing class "standard" (threshold 1536) and the pool's
// disaggregation threshold 256.
func pdCore(t *testing.T, roles map[string]Role, o Options) *Core {
	t.Helper()
	o.DisaggregateAboveUncachedTokens = 256
	c, err := New(byHeader(1536, class("standard", 1, 0), class("eager", 1, 0)), o)
	if err != nil {
		t.Fatal(err)
	}
	var eps []Endpoint
	for a, r := range roles {
		eps = append(eps, Endpoint{Addr: a, MaxBatchedTokens: 8192, Role: r})
	}
	slices.SortFunc(eps, func(a, b Endpoint) int { return strings.Compare(a.Addr, b.Addr) })
	c.SetEndpoints(0, eps)
	c.Drain(0)
	return c
}

func pdPool() map[string]Role {
	return map[string]Role{pdP1: RolePrefill, pdP2: RolePrefill, pdD1: RoleDecode, pdD2: RoleDecode}
}

// account returns an endpoint's active prefill and in-flight count.
func account(c *Core, addr string) (uint64, int) {
	for _, e := range c.Snapshot().Endpoints {
		if e.Addr == addr {
			return e.ActivePrefill, e.InFlight
		}
	}
	return 0, -1
}

// grantOne admits t and requires a direct grant.
func grantOne(t *testing.T, c *Core, now int64, tk *Ticket) *Grant {
	t.Helper()
	admit(c, now, tk)
	l := c.Drain(now)
	if len(l) != 1 || l[0].Grant == nil {
		t.Fatalf("want a direct grant, got %v", l)
	}
	return l[0].Grant
}

// TestDisaggregatedGrant: a long prompt is prefilled on a prefill pod and
// decoded on a decode pod: the destination is the decode pod, the prefill
// pod is named for x-prefiller-host-port, and the prefill pod holds the
// prefill charge until the first byte while the decode pod holds the
// request until its end.
func TestDisaggregatedGrant(t *testing.T) {
	c := pdCore(t, pdPool(), Options{})
	g := grantOne(t, c, 0, &Ticket{RawISL: 1000})
	if g.PD != PDDisaggregated || !slices.Contains([]string{pdP1, pdP2}, g.Prefiller()) ||
		len(g.Endpoints) != 1 || !slices.Contains([]string{pdD1, pdD2}, g.Endpoints[0]) {
		t.Fatalf("grant %v prefill %q (%s), want a decode pod with a prefill pod", g.Endpoints, g.Prefiller(), g.PD)
	}
	p, d := g.Prefiller(), g.Endpoints[0]
	check := func(when string, pa uint64, pf int, da uint64, df int) {
		t.Helper()
		if a, f := account(c, p); a != pa || f != pf {
			t.Errorf("%s: prefill pod %d/%d, want %d/%d", when, a, f, pa, pf)
		}
		if a, f := account(c, d); a != da || f != df {
			t.Errorf("%s: decode pod %d/%d, want %d/%d", when, a, f, da, df)
		}
	}
	check("granted", 1000, 1, 0, 1)
	c.Release(g, EventFirstByte)
	check("first byte", 0, 0, 0, 1)
	c.Release(g, EventDone)
	check("done", 0, 0, 0, 0)
}

// TestShortPromptStaysLocal: at or below the threshold the decode pod
// serves the whole request; a prefill pod never does.
func TestShortPromptStaysLocal(t *testing.T) {
	c := pdCore(t, pdPool(), Options{})
	for _, n := range []uint64{1, 256} {
		g := grantOne(t, c, 0, &Ticket{RawISL: n})
		if g.PD != PDBelowThreshold || g.Prefiller() != "" || !slices.Contains([]string{pdD1, pdD2}, g.Endpoints[0]) {
			t.Errorf("%d tokens: grant %v prefill %q (%s), want a decode pod alone", n, g.Endpoints, g.Prefiller(), g.PD)
		}
		if a, f := account(c, g.Endpoints[0]); a != n || f != 1 {
			t.Errorf("%d tokens: the decode pod holds %d/%d, want the prefill charge and one in flight", n, a, f)
		}
		c.Release(g, EventDone)
	}
}

// TestPoolWithoutPrefillPods: decode and prefill-decode roles alone change
// nothing: every endpoint takes whole requests and no decision is named.
func TestPoolWithoutPrefillPods(t *testing.T) {
	c := pdCore(t, map[string]Role{pdD1: RoleDecode, pdPD: RolePrefillDecode}, Options{})
	g := grantOne(t, c, 0, &Ticket{RawISL: 5000})
	if g.PD != PDNone || g.Prefiller() != "" {
		t.Errorf("grant %v prefill %q decision %q, want neither", g.Endpoints, g.Prefiller(), g.PD)
	}
}

// TestClassThresholdOverridesPool: a class's own threshold beats the
// pool's default, in both directions.
func TestClassThresholdOverridesPool(t *testing.T) {
	c := pdCore(t, pdPool(), Options{})
	pol := byHeader(1536, class("standard", 1, 0), class("eager", 1, 0))
	pol.Disaggregate = []policy.Disaggregation{{AboveUncached: 4096, Set: true}, {AboveUncached: 0, Set: true}}
	if err := c.SetPolicy(pol); err != nil {
		t.Fatal(err)
	}
	if g := grantOne(t, c, 0, &Ticket{RawISL: 1000, ClassHeader: "standard"}); g.PD != PDBelowThreshold {
		t.Errorf("standard (4096) with 1000 tokens: %s, want below_threshold", g.PD)
	}
	if g := grantOne(t, c, 0, &Ticket{RawISL: 1, ClassHeader: "eager"}); g.PD != PDDisaggregated {
		t.Errorf("eager (0) with 1 token: %s, want disaggregated", g.PD)
	}
}

// TestBusyTestGatesOnPrefillPods: a disaggregating request waits while
// every prefill pod is busy, however idle the decode pods; a short one is
// judged on the decode pods and goes at once. A first byte lets the
// waiting one go.
func TestBusyTestGatesOnPrefillPods(t *testing.T) {
	c := pdCore(t, pdPool(), Options{})
	g1 := grantOne(t, c, 0, &Ticket{RawISL: 2000})
	g2 := grantOne(t, c, 0, &Ticket{RawISL: 2000})
	if g1.Prefiller() == g2.Prefiller() {
		t.Fatalf("both on %s: the second should go to the idle prefill pod", g1.Prefiller())
	}
	r := admit(c, 0, &Ticket{RawISL: 2000})
	if l := c.Drain(0); len(l) != 0 {
		t.Fatalf("both prefill pods busy: %s, want the request queued", leaveString(l[0]))
	}
	if g := grantOne(t, c, 0, &Ticket{RawISL: 100, ClassHeader: "eager"}); g.PD != PDBelowThreshold {
		t.Errorf("short request: %s, want it served on a decode pod at once", g.PD)
	}
	c.Release(g1, EventFirstByte)
	l := c.Drain(0)
	if len(l) != 1 || l[0].Req != r || l[0].Grant == nil || l[0].Grant.Prefiller() != g1.Prefiller() {
		t.Fatalf("after the first byte: %v, want the queued request prefilled on %s", l, g1.Prefiller())
	}
}

// TestDecodePickByLoad: the decode pod is chosen by decode load: fresh
// first, then not nearly full, then the fewest sequences.
func TestDecodePickByLoad(t *testing.T) {
	c := pdCore(t, pdPool(), Options{})
	c.SetMetrics(0, pdD1, podmetrics.Metrics{Known: podmetrics.Running | podmetrics.KVCacheUsage, Running: 6, KVCacheUsage: 0.3}, false)
	c.SetMetrics(0, pdD2, podmetrics.Metrics{Known: podmetrics.Running | podmetrics.KVCacheUsage, Running: 2, KVCacheUsage: 0.3}, false)
	if g := grantOne(t, c, 0, &Ticket{RawISL: 1000}); g.Endpoints[0] != pdD2 {
		t.Errorf("decode pick %s, want %s (2 running against 6)", g.Endpoints[0], pdD2)
	}
	c.SetMetrics(0, pdD2, podmetrics.Metrics{Known: podmetrics.Running | podmetrics.KVCacheUsage, Running: 2, KVCacheUsage: 0.97}, false)
	if g := grantOne(t, c, 0, &Ticket{RawISL: 1000}); g.Endpoints[0] != pdD1 {
		t.Errorf("decode pick %s, want %s (the other's KV cache is nearly full)", g.Endpoints[0], pdD1)
	}
	c.SetMetrics(0, pdD1, podmetrics.Metrics{}, true)
	if g := grantOne(t, c, 0, &Ticket{RawISL: 1000}); g.Endpoints[0] != pdD2 {
		t.Errorf("decode pick %s, want %s (the other is stale)", g.Endpoints[0], pdD2)
	}
}

// TestDecodeTiesTakeTurns: equally loaded decode pods share requests.
func TestDecodeTiesTakeTurns(t *testing.T) {
	c := pdCore(t, pdPool(), Options{})
	seen := map[string]int{}
	for range 4 {
		g := grantOne(t, c, 0, &Ticket{RawISL: 300})
		seen[g.Endpoints[0]]++
		c.Release(g, EventDone)
	}
	if seen[pdD1] != 2 || seen[pdD2] != 2 {
		t.Errorf("decode picks %v, want two each", seen)
	}
}

// TestNoDecodeStage: a pool of prefill pods alone answers 503 naming the
// decode stage, for requests that would disaggregate and for short ones.
func TestNoDecodeStage(t *testing.T) {
	c := pdCore(t, map[string]Role{pdP1: RolePrefill, pdP2: RolePrefill}, Options{})
	for _, n := range []uint64{100, 5000} {
		admit(c, 0, &Ticket{RawISL: n})
		l := c.Drain(0)
		var ne *NoEndpointError
		if len(l) != 1 || !errors.As(l[0].Err, &ne) || !strings.Contains(ne.Filter, "decode stage") {
			t.Errorf("%d tokens: %v, want 503 naming the decode stage", n, l)
		}
	}
}

// TestNoEligiblePrefillPod: a subset hint without prefill pods keeps a
// long request on a decode pod, named no_prefill_endpoint.
func TestNoEligiblePrefillPod(t *testing.T) {
	c := pdCore(t, pdPool(), Options{})
	g := grantOne(t, c, 0, &Ticket{RawISL: 5000, Allow: []string{pdD1, pdD2}, HasAllow: true})
	if g.PD != PDNoPrefillEndpoint || g.Prefiller() != "" {
		t.Errorf("grant %v prefill %q (%s), want a decode pod alone, no_prefill_endpoint", g.Endpoints, g.Prefiller(), g.PD)
	}
}

// TestPinnedIgnoresRoles: a request pinned to one endpoint goes there
// whole, even a prefill pod.
func TestPinnedIgnoresRoles(t *testing.T) {
	c := pdCore(t, pdPool(), Options{})
	g := grantOne(t, c, 0, &Ticket{RawISL: 5000, Allow: []string{pdP1}, HasAllow: true})
	if g.Endpoints[0] != pdP1 || g.Prefiller() != "" || g.PD != PDNone {
		t.Errorf("grant %v prefill %q (%s), want %s alone", g.Endpoints, g.Prefiller(), g.PD, pdP1)
	}
}

// TestPrefillPodsLeaveWhileQueued: a queued disaggregating request whose
// prefill pods all become ineligible is served whole by a decode pod
// (no_prefill_endpoint); once the pool has no prefill pod at all it is a
// pool without roles.
func TestPrefillPodsLeaveWhileQueued(t *testing.T) {
	for _, tc := range []struct {
		name string
		eps  []Endpoint
		pd   PDDecision
	}{
		{"tainted", []Endpoint{{Addr: pdP1, Role: RolePrefill, Tainted: true}, {Addr: pdD1, Role: RoleDecode}, {Addr: pdD2, Role: RoleDecode}}, PDNoPrefillEndpoint},
		{"removed", []Endpoint{{Addr: pdD1, Role: RoleDecode}, {Addr: pdD2, Role: RoleDecode}}, PDNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := pdCore(t, pdPool(), Options{})
			grantOne(t, c, 0, &Ticket{RawISL: 2000})
			grantOne(t, c, 0, &Ticket{RawISL: 2000})
			r := admit(c, 0, &Ticket{RawISL: 2000})
			if l := c.Drain(0); len(l) != 0 {
				t.Fatalf("want the request queued, got %v", l)
			}
			c.SetEndpoints(0, tc.eps)
			l := c.Drain(0)
			if len(l) != 1 || l[0].Req != r || l[0].Grant == nil || l[0].Grant.PD != tc.pd || l[0].Grant.Prefiller() != "" {
				t.Fatalf("after the prefill pods left: %v, want the request served whole (%q)", l, tc.pd)
			}
		})
	}
}

// TestPrefillPodsArriveWhileQueued: a request that queued in a pool
// without prefill pods is served whole when prefill pods join: never by a
// prefill-only pod, however idle, but by the decode stage once it has room
// (no_prefill_endpoint).
func TestPrefillPodsArriveWhileQueued(t *testing.T) {
	c := pdCore(t, map[string]Role{pdPD: RolePrefillDecode}, Options{})
	g := grantOne(t, c, 0, &Ticket{RawISL: 2000})
	r := admit(c, 0, &Ticket{RawISL: 2000})
	if l := c.Drain(0); len(l) != 0 {
		t.Fatalf("want the request queued, got %v", l)
	}
	c.SetEndpoints(0, []Endpoint{{Addr: pdP1, Role: RolePrefill, MaxBatchedTokens: 8192}, {Addr: pdPD, MaxBatchedTokens: 8192}})
	if l := c.Drain(0); len(l) != 0 {
		t.Fatalf("a prefill pod joined: %v, want the request still queued for the busy prefill-decode pod", l)
	}
	c.Release(g, EventFirstByte)
	l := c.Drain(0)
	if len(l) != 1 || l[0].Req != r || l[0].Grant == nil || l[0].Grant.Endpoints[0] != pdPD || l[0].Grant.Prefiller() != "" ||
		l[0].Grant.PD != PDNoPrefillEndpoint {
		t.Fatalf("after the first byte: %v, want the request served whole by %s (no_prefill_endpoint)", l, pdPD)
	}
}

// TestSnapshotFromPrefillPods: a disaggregating request's cached tokens
// are the best overlap over the prefill pods, and the prefill pick follows
// it; a short one's are over the decode stage.
func TestSnapshotFromPrefillPods(t *testing.T) {
	c := pdCore(t, pdPool(), Options{Prefix: &PrefixOptions{BlockSize: 16}, Chooser: NewCostChooser(1, 1)})
	blocks := make([]uint64, 64)
	for i := range blocks {
		blocks[i] = uint64(i + 1)
	}
	c.index.Record(int(c.reg.byAddr[pdP2].id), blocks[:32], 16, 0) // 512 tokens on P2
	c.index.Record(int(c.reg.byAddr[pdD1].id), blocks[:8], 16, 0)  // 128 on D1
	tk := &Ticket{RawISL: 1024, Blocks: blocks, BlockSize: 16}
	g := grantOne(t, c, 0, tk)
	if g.PD != PDDisaggregated || g.Prefiller() != pdP2 || tk.Cached != 512 {
		t.Errorf("long prompt: prefill %q (%s), cached %d; want %s with 512 cached", g.Prefiller(), g.PD, tk.Cached, pdP2)
	}
	short := &Ticket{RawISL: 200, Blocks: blocks[:12], BlockSize: 16}
	if g := grantOne(t, c, 0, short); g.PD != PDBelowThreshold || short.Cached != 128 {
		t.Errorf("short prompt: %s cached %d, want below_threshold with D1's 128", g.PD, short.Cached)
	}
}

// TestRolesRandom drives a P/D pool with random admissions, releases,
// cancels, role changes and scrapes, and checks after every step: no
// prefill-only endpoint is ever a destination; a named prefill pod is a
// prefill-only endpoint and was not busy for a queueing class; and the
// accounting is the sum over unreleased grants (prefill charge and
// in-flight on the prefill pod until the first byte, in-flight on the
// decode pod to the end), zero at the end.
func TestRolesRandom(t *testing.T) {
	addrs := []string{pdP1, pdP2, pdD1, pdD2, pdPD}
	disaggregated := 0
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 7))
		roles := map[string]Role{}
		for _, a := range addrs {
			roles[a] = Role(rng.IntN(3))
		}
		c := pdCore(t, roles, Options{MaxFallbacks: 1})
		type live struct {
			g           *Grant
			r           *Request
			first, done bool
			charge      uint64
		}
		var reqs []*live
		want := func() (map[string]uint64, map[string]int) {
			act, inf := map[string]uint64{}, map[string]int{}
			for _, x := range reqs {
				if x.g == nil || x.done {
					continue
				}
				if x.g.Prefiller() == "" {
					if !x.first {
						act[x.g.Endpoints[0]] += x.charge
					}
					inf[x.g.Endpoints[0]]++
					continue
				}
				if !x.first {
					act[x.g.Prefiller()] += x.charge
					inf[x.g.Prefiller()]++
				}
				inf[x.g.Endpoints[0]]++
			}
			return act, inf
		}
		setRoles := func() {
			var eps []Endpoint
			for _, a := range addrs {
				eps = append(eps, Endpoint{Addr: a, MaxBatchedTokens: 8192, Role: roles[a]})
			}
			c.SetEndpoints(0, eps)
		}
		for step := range 300 {
			switch op := rng.IntN(10); {
			case op < 4:
				x := &live{}
				tk := &Ticket{RawISL: uint64(rng.IntN(3000) + 1), ClassHeader: []string{"standard", "eager"}[rng.IntN(2)]}
				x.r = admit(c, 0, tk)
				reqs = append(reqs, x)
			case op < 6:
				if len(reqs) > 0 {
					if x := reqs[rng.IntN(len(reqs))]; x.g != nil && !x.first {
						c.Release(x.g, EventFirstByte)
						x.first = true
					}
				}
			case op < 8:
				if len(reqs) > 0 {
					if x := reqs[rng.IntN(len(reqs))]; x.g != nil && !x.done {
						c.Release(x.g, EventDone)
						x.first, x.done = true, true
					}
				}
			case op == 8:
				a := addrs[rng.IntN(len(addrs))]
				roles[a] = Role(rng.IntN(3))
				setRoles()
			default:
				a := addrs[rng.IntN(len(addrs))]
				c.SetMetrics(0, a, podmetrics.Metrics{Known: podmetrics.Running | podmetrics.KVCacheUsage,
					Running: rng.IntN(8), KVCacheUsage: rng.Float64()}, false)
			}
			act, _ := want() // the model before this drain's grants
			for _, l := range c.Drain(0) {
				var x *live
				for _, y := range reqs {
					if y.r == l.Req {
						x = y
					}
				}
				if l.Grant == nil {
					x.done = true
					continue
				}
				x.g, x.charge = l.Grant, l.Req.Ticket.Uncached()
				for _, ep := range l.Grant.Endpoints {
					if roles[ep] == RolePrefill && l.Grant.PD != PDNone {
						t.Fatalf("seed %d step %d: destination %s is a prefill pod (grant %v, %s)", seed, step, ep, l.Grant.Endpoints, l.Grant.PD)
					}
				}
				if p := l.Grant.Prefiller(); p != "" {
					disaggregated++
					if roles[p] != RolePrefill {
						t.Fatalf("seed %d step %d: prefill pod %s has role %v", seed, step, p, roles[p])
					}
					if act[p] > 1536 {
						t.Fatalf("seed %d step %d: prefill pod %s was busy (%d) at the grant", seed, step, p, act[p])
					}
					act[p] += x.charge
				} else {
					act[l.Grant.Endpoints[0]] += x.charge
				}
			}
			act, inf := want()
			for _, es := range c.Snapshot().Endpoints {
				if es.ActivePrefill != act[es.Addr] || es.InFlight != inf[es.Addr] {
					t.Fatalf("seed %d step %d: %s holds %d/%d, want %d/%d", seed, step, es.Addr, es.ActivePrefill, es.InFlight, act[es.Addr], inf[es.Addr])
				}
			}
		}
		for _, x := range reqs {
			if x.g != nil && !x.done {
				c.Release(x.g, EventDone)
				x.done = true
			}
		}
		c.Shutdown(0)
		c.Drain(0)
		for _, es := range c.Snapshot().Endpoints {
			if es.ActivePrefill != 0 || es.InFlight != 0 {
				t.Fatalf("seed %d: %s holds %d/%d after every release", seed, es.Addr, es.ActivePrefill, es.InFlight)
			}
		}
	}
	if disaggregated < 100 {
		t.Errorf("%d disaggregated grants in 40 runs: the test hardly exercises them", disaggregated)
	}
}

// scrapeEP delivers a fresh scrape of addr at now: waiting and running
// requests, and the prompt-token counter.
func scrapeEP(c *Core, now int64, addr string, waiting, running int, promptTokens float64) {
	c.SetMetrics(now, addr, podmetrics.Metrics{
		Known:   podmetrics.Waiting | podmetrics.Running | podmetrics.PromptTokens,
		Waiting: waiting, Running: running, PromptTokens: promptTokens,
	}, false)
}

// TestDisaggregatedStreamEndsFirst: behind a header-only gateway a
// disaggregated request's stream ends at the pick. Its charge waits in the
// prefill pod's engine ledger until that engine's counts carry it;
// neither pod counts it in flight any longer. The decode pod's ledger
// keeps the grant it serves whole until its own engine's counts carry
// that one, and then counts it among the engine's waiting requests.
func TestDisaggregatedStreamEndsFirst(t *testing.T) {
	c := pdCore(t, map[string]Role{pdP1: RolePrefill, pdPD: RolePrefillDecode}, Options{ExpectMetrics: true})
	scrapeEP(c, 0, pdP1, 0, 0, 0)
	scrapeEP(c, 0, pdPD, 0, 0, 0)
	long := grantOne(t, c, ms(1), &Ticket{RawISL: 1000})
	if long.Prefiller() != pdP1 || long.Endpoints[0] != pdPD {
		t.Fatalf("long prompt: prefill %q, decode %v; want %s then %s", long.Prefiller(), long.Endpoints, pdP1, pdPD)
	}
	short := grantOne(t, c, ms(2), &Ticket{RawISL: 100})
	if short.PD != PDBelowThreshold || short.Endpoints[0] != pdPD {
		t.Fatalf("short prompt: %v (%v), want %s whole", short.Endpoints, short.PD, pdPD)
	}
	c.Release(long, EventDone)
	c.Release(short, EventDone)
	state := func(addr string) EndpointSnapshot {
		for _, e := range c.Snapshot().Endpoints {
			if e.Addr == addr {
				return e
			}
		}
		t.Fatalf("no endpoint %s", addr)
		return EndpointSnapshot{}
	}
	if p, d := state(pdP1), state(pdPD); p.ActivePrefill != 1000 || p.AwaitingEngine != 1 || p.InFlight != 0 ||
		d.ActivePrefill != 100 || d.AwaitingEngine != 1 || d.InFlight != 0 {
		t.Fatalf("after both streams ended: prefill pod %+v, decode pod %+v; want 1000 and 100 tokens awaiting, nothing in flight", p, d)
	}
	// Scraped 3 ms after the grants were sent: they may still be on
	// their way, so both stay charged.
	scrapeEP(c, ms(5), pdPD, 0, 0, 0)
	scrapeEP(c, ms(5), pdP1, 0, 0, 0)
	if p, d := state(pdP1), state(pdPD); p.AwaitingEngine != 1 || d.AwaitingEngine != 1 {
		t.Fatalf("3 ms after the grants: prefill pod %+v, decode pod %+v; want both still awaiting", p, d)
	}
	// The decode pod's engine holds the short request waiting (and the
	// long one running): its count carries the short one from now on.
	scrapeEP(c, ms(50), pdPD, 1, 1, 1000)
	if d := state(pdPD); d.ActivePrefill != 0 || d.AwaitingEngine != 0 || d.UnseenWaiting != 1 {
		t.Fatalf("the decode pod's engine shows the short request waiting: %+v, want it counted there, not charged", d)
	}
	scrapeEP(c, ms(50), pdP1, 0, 0, 1000)
	if p := state(pdP1); p.ActivePrefill != 0 || p.AwaitingEngine != 0 || p.UnseenWaiting != 0 {
		t.Fatalf("the prefill pod prefilled the long prompt: %+v, want nothing charged", p)
	}
}
