package sched

import (
	"testing"

	"github.com/laneway-dev/laneway/pkg/podmetrics"
	"github.com/laneway-dev/laneway/pkg/policy"
)

// autoCore is a core with one endpoint (step budget 8192) and one class
// with an auto threshold, fresh after a first scrape at time 0.
func autoCore(t *testing.T) *Core {
	t.Helper()
	p := byHeader(0, class("standard", 512, 0))
	p.Classes[0].Queueing = true
	p.Busy[0] = policy.BusyTest{Auto: true}
	c := newCore(t, p, Options{ExpectMetrics: true}, ep1)
	scrape(c, 0, 0, 0, 0)
	return c
}

// The auto threshold starts at 7/8 of the step budget, the busy test reads it,
// the engine's queue lowers it, the snapshot shows it, and an engine
// restart (its counter going back) starts it over.
func TestAutoThreshold(t *testing.T) {
	c := autoCore(t)
	if e := endpointState(c); !e.HasAuto || e.AutoThreshold != 7168 {
		t.Fatalf("start: %+v, want 7/8 of the step budget", e)
	}
	// 15 prompts of 512: the 15th takes the load past 7168.
	for i := 0; i < 15; i++ {
		grantNow(t, c, ms(1), 512)
	}
	admit(c, ms(2), &Ticket{RawISL: 512})
	if l := c.Drain(ms(2)); len(l) != 0 || c.Len() != 1 {
		t.Fatalf("over the threshold: %d decisions, %d queued; want the request held", len(l), c.Len())
	}
	// The engine keeps 12 of them waiting at every scrape of a window
	// (the first window, opened at the scrape of time 0, saw none): the
	// threshold falls to about its intake plus one prompt.
	for i := int64(1); i <= 12; i++ {
		scrape(c, ms(100*i), 12, 5, 0)
	}
	if e := endpointState(c); e.AutoThreshold >= 7168 || e.AutoThreshold < 512 || !e.Busy {
		t.Fatalf("after a window of 12 waiting: %+v, want the threshold lowered to [512, 7168) and the endpoint busy", e)
	}
	// The engine restarted: its counter went back.
	scrape(c, ms(1300), 0, 0, 100)
	scrape(c, ms(1400), 0, 0, 0)
	if e := endpointState(c); e.AutoThreshold != 7168 {
		t.Fatalf("after a restart: threshold %d, want the start again", e.AutoThreshold)
	}
}

// The requests' max_tokens reach the auto threshold through the core: an
// engine whose 262,144-token cache 1,000-token prompts asking for 140
// tokens will fill gets the decode-bound level from the first window, and
// the snapshot shows the output it expects.
func TestDecodeBoundThroughTheCore(t *testing.T) {
	c := autoCore(t)
	for i := 0; i < 3; i++ {
		r := admit(c, ms(1), &Ticket{RawISL: 1000, OutputTokens: 140})
		if l := c.Drain(ms(1)); len(l) != 1 || r.Grant() == nil {
			t.Fatalf("request %d: %v, want a grant", i, l)
		}
	}
	if e := endpointState(c); e.ExpectedOutput != 0 {
		t.Fatalf("before a window with the engine's output counters: expected output %d, want 0", e.ExpectedOutput)
	}
	for i := int64(1); i <= 6; i++ {
		c.SetMetrics(ms(100*i), ep1, podmetrics.Metrics{
			Known: podmetrics.Waiting | podmetrics.Running | podmetrics.KVCacheUsage | podmetrics.BlockSize | podmetrics.NumBlocks |
				podmetrics.GenerationTokens | podmetrics.Finished,
			Running: 3, KVCacheUsage: 0.02, BlockSize: 16, NumBlocks: 16384,
		}, false)
	}
	// The mean prompt moved from its seed toward 1,000 and the mean output
	// is 140: the level is what the engine frees per step less a prompt.
	e := endpointState(c)
	if e.ExpectedOutput != 140 {
		t.Fatalf("expected output %d, want the asked 140", e.ExpectedOutput)
	}
	p := c.meanPrompt
	want := max(p*(262144/(p+140))/140-p, 512)
	if e.AutoThreshold != want {
		t.Fatalf("threshold %d, want the decode-bound level %d (mean prompt %d)", e.AutoThreshold, want, p)
	}
}

// A prefill-only pod holds a request only for its prefill, so the output
// the request asks for says nothing about its cache: no decode-bound level
// there, while the decode pod of the same requests gets one.
func TestNoDecodeBoundOnPrefillPods(t *testing.T) {
	p := byHeader(0, class("standard", 512, 0))
	p.Classes[0].Queueing = true
	p.Busy[0] = policy.BusyTest{Auto: true}
	c := newCore(t, p, Options{ExpectMetrics: true, DisaggregateAboveUncachedTokens: 256})
	c.SetEndpoints(0, []Endpoint{{Addr: pdP1, MaxBatchedTokens: 8192, Role: RolePrefill}, {Addr: pdD1, MaxBatchedTokens: 8192, Role: RoleDecode}})
	scrapeEP(c, 0, pdP1, 0, 0, 0)
	scrapeEP(c, 0, pdD1, 0, 0, 0)
	for range 3 {
		grantOne(t, c, ms(1), &Ticket{RawISL: 1000, OutputTokens: 140})
	}
	for i := int64(1); i <= 6; i++ {
		for _, addr := range []string{pdP1, pdD1} {
			c.SetMetrics(ms(100*i), addr, podmetrics.Metrics{
				Known: podmetrics.Waiting | podmetrics.Running | podmetrics.BlockSize | podmetrics.NumBlocks |
					podmetrics.GenerationTokens | podmetrics.Finished,
				Running: 3, BlockSize: 16, NumBlocks: 16384,
			}, false)
		}
	}
	if tp, td := thresholdOf(t, c, pdP1), thresholdOf(t, c, pdD1); tp != 7168 || td >= 7168 {
		t.Fatalf("thresholds %d (prefill pod), %d (decode pod); want the prefill pod's at the start, the decode pod's at its decode-bound level", tp, td)
	}
}

// A fixed threshold leaves the auto controller out of the snapshot.
func TestFixedThresholdHasNoAuto(t *testing.T) {
	c := ledgerCore(t)
	if e := endpointState(c); e.HasAuto {
		t.Fatalf("%+v: a policy without auto classes shows an auto threshold", e)
	}
}

// thresholdOf is the auto threshold of addr in c's snapshot.
func thresholdOf(t *testing.T, c *Core, addr string) uint64 {
	t.Helper()
	th, ok := c.AutoThreshold(addr)
	if !ok {
		t.Fatalf("%s has no auto threshold", addr)
	}
	return th
}

// TestAutoThresholdOnPrefillPods: in a P/D pool the busy test of a
// disaggregating request is on the prefill pod, so it reads the prefill
// pod's own auto threshold: when that pod's engine keeps a queue, its
// threshold falls and requests wait for it, however idle the decode pod
// (whose threshold stays at the start) and however far below the start
// the prefill load is.
func TestAutoThresholdOnPrefillPods(t *testing.T) {
	p := byHeader(0, class("standard", 512, 0), class("eager", 512, 0))
	for i := range p.Classes {
		p.Classes[i].Queueing = true
		p.Busy[i] = policy.BusyTest{Auto: true}
	}
	c := newCore(t, p, Options{ExpectMetrics: true, DisaggregateAboveUncachedTokens: 256})
	c.SetEndpoints(0, []Endpoint{{Addr: pdP1, MaxBatchedTokens: 8192, Role: RolePrefill}, {Addr: pdD1, MaxBatchedTokens: 8192, Role: RoleDecode}})
	scrapeEP(c, 0, pdP1, 0, 0, 0)
	scrapeEP(c, 0, pdD1, 0, 0, 0)
	if tp, td := thresholdOf(t, c, pdP1), thresholdOf(t, c, pdD1); tp != 7168 || td != 7168 {
		t.Fatalf("start: prefill pod %d, decode pod %d; want 7/8 of the step budget each", tp, td)
	}
	// Prefills of 1000 go while the prefill pod's load is at most 7168:
	// eight of them.
	var gs []*Grant
	for range 8 {
		g := grantOne(t, c, ms(1), &Ticket{RawISL: 1000})
		if g.PD != PDDisaggregated || g.Prefiller() != pdP1 || g.Endpoints[0] != pdD1 {
			t.Fatalf("grant %v prefill %q (%s), want decode on %s after prefill on %s", g.Endpoints, g.Prefiller(), g.PD, pdD1, pdP1)
		}
		gs = append(gs, g)
	}
	r := admit(c, ms(1), &Ticket{RawISL: 1000})
	if l := c.Drain(ms(1)); len(l) != 0 {
		t.Fatalf("prefill pod at 8000 tokens: %s, want the request held", leaveString(l[0]))
	}
	if g := grantOne(t, c, ms(1), &Ticket{RawISL: 100, ClassHeader: "eager"}); g.PD != PDBelowThreshold || g.Endpoints[0] != pdD1 {
		t.Errorf("short request: %v (%s), want it served on the decode pod at once", g.Endpoints, g.PD)
	} else {
		c.Release(g, EventDone)
	}
	// The prefill pod's engine keeps 6 of our 8 prompts waiting for a
	// window: more than the band (4 prompts). The decode pod shows none.
	for i := int64(1); i <= 12; i++ {
		scrapeEP(c, ms(100*i), pdP1, 6, 2, 0)
		scrapeEP(c, ms(100*i), pdD1, 0, 9, 0)
	}
	tp, td := thresholdOf(t, c, pdP1), thresholdOf(t, c, pdD1)
	if tp >= 4000 || td != 7168 {
		t.Fatalf("after a window of 6 waiting on the prefill pod: thresholds %d (prefill), %d (decode); want the prefill pod's below 4000, the decode pod's at the start", tp, td)
	}
	// Four first bytes: 4000 tokens in prefill, under the start but over
	// the prefill pod's lowered threshold.
	for _, g := range gs[:4] {
		c.Release(g, EventFirstByte)
	}
	if l := c.Drain(ms(1300)); len(l) != 0 {
		t.Fatalf("prefill pod at 4000 tokens, threshold %d: %s, want the request still held", tp, leaveString(l[0]))
	}
	for _, g := range gs[4:] {
		c.Release(g, EventFirstByte)
		if a, _ := account(c, pdP1); a <= tp {
			break
		}
	}
	l := c.Drain(ms(1300))
	if len(l) != 1 || l[0].Req != r || l[0].Grant == nil || l[0].Grant.Prefiller() != pdP1 {
		t.Fatalf("prefill pod at its threshold %d: %v, want the held request prefilled on %s", tp, l, pdP1)
	}
}
