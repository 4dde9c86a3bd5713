package sched

import (
	"testing"

	"github.com/laneway-dev/laneway/pkg/podmetrics"
)

// ledgerCore is a core with one endpoint whose metrics are expected, made
// fresh by a first scrape at time 0 with the engine's counter at 0.
func ledgerCore(t *testing.T) *Core {
	t.Helper()
	c := newCore(t, byHeader(1536, class("standard", 512, 0)), Options{ExpectMetrics: true}, ep1)
	scrape(c, 0, 0, 0, 0)
	return c
}

const ep1 = "10.0.0.1:8000"

// scrape delivers a fresh scrape of ep1 at now: waiting and running
// requests, and the prompt-token counter.
func scrape(c *Core, now int64, waiting, running int, promptTokens float64) {
	c.SetMetrics(now, ep1, podmetrics.Metrics{
		Known:   podmetrics.Waiting | podmetrics.Running | podmetrics.PromptTokens,
		Waiting: waiting, Running: running, PromptTokens: promptTokens,
	}, false)
}

// grantNow admits a request of raw prompt tokens at now and returns its
// grant, which must be direct.
func grantNow(t *testing.T, c *Core, now int64, raw uint64) *Grant {
	t.Helper()
	r := admit(c, now, &Ticket{RawISL: raw})
	l := c.Drain(now)
	if len(l) != 1 || l[0].Grant == nil {
		t.Fatalf("request of %d tokens at %d: %v, want a direct grant", raw, now, l)
	}
	return r.Grant()
}

func endpointState(c *Core) EndpointSnapshot { return c.Snapshot().Endpoints[0] }

// TestStreamEndWithoutFirstByteKeepsTheCharge: a header-only gateway
// ends the stream at the pick; the prompt is still in the engine, so its
// tokens stay charged until the engine's counter shows it prefilled.
func TestStreamEndWithoutFirstByteKeepsTheCharge(t *testing.T) {
	c := ledgerCore(t)
	a := grantNow(t, c, ms(1), 512)
	b := grantNow(t, c, ms(2), 512)
	c.Release(a, EventDone)
	c.Release(b, EventDone)
	if e := endpointState(c); e.ActivePrefill != 1024 || e.AwaitingEngine != 2 || e.InFlight != 0 {
		t.Fatalf("after both streams ended: %+v, want 1024 tokens charged, 2 awaiting, none in flight", e)
	}
	// The engine prefilled 700 tokens: a's 512, and 188 of b's.
	scrape(c, ms(50), 0, 2, 700)
	if e := endpointState(c); e.ActivePrefill != 512 || e.AwaitingEngine != 1 {
		t.Fatalf("after 700 prefilled tokens: %+v, want b's 512 still charged", e)
	}
	// 324 more cover b with the 188 carried over.
	scrape(c, ms(100), 0, 1, 1024)
	if e := endpointState(c); e.ActivePrefill != 0 || e.AwaitingEngine != 0 {
		t.Fatalf("after 1024 prefilled tokens: %+v, want nothing charged", e)
	}
}

// TestFirstBytesAreNotCountedTwice: a prompt whose first byte was
// reported was released already; the counter's growth for it must not
// release another grant that still waits in the engine.
func TestFirstBytesAreNotCountedTwice(t *testing.T) {
	c := ledgerCore(t)
	exact := grantNow(t, c, ms(1), 512)
	header := grantNow(t, c, ms(2), 512)
	c.Release(header, EventDone) // a header-only stream
	c.Release(exact, EventFirstByte)
	c.Release(exact, EventDone)
	scrape(c, ms(50), 1, 1, 512) // the engine prefilled the exact one only
	if e := endpointState(c); e.ActivePrefill != 512 || e.AwaitingEngine != 1 {
		t.Fatalf("%+v: want the header-only grant still charged", e)
	}
}

// TestEngineCountsBoundTheLedger: every awaiting request is in the
// engine, waiting or running; when the engine holds fewer, the oldest
// are released (an engine without a prompt-token counter, or requests
// it dropped).
func TestEngineCountsBoundTheLedger(t *testing.T) {
	c := ledgerCore(t)
	var gs []*Grant
	for i := range 3 {
		gs = append(gs, grantNow(t, c, ms(int64(i)), 500))
	}
	for _, g := range gs {
		c.Release(g, EventDone)
	}
	c.SetMetrics(ms(10), ep1, podmetrics.Metrics{Known: podmetrics.Waiting | podmetrics.Running, Waiting: 1}, false)
	if e := endpointState(c); e.ActivePrefill != 500 || e.AwaitingEngine != 1 {
		t.Fatalf("engine holds 1 request: %+v, want 1 awaiting, 500 tokens", e)
	}
	// A restarted engine (its counter went back) lost what it held.
	scrape(c, ms(20), 0, 0, 0)
	c.SetMetrics(ms(30), ep1, podmetrics.Metrics{Known: podmetrics.PromptTokens, PromptTokens: 0}, false)
	if e := endpointState(c); e.ActivePrefill != 0 || e.AwaitingEngine != 0 {
		t.Fatalf("after the engine emptied: %+v, want nothing charged", e)
	}
}

// TestRestartedEngineReleasesTheLedger: a counter that goes back means a
// new engine process, which holds none of the old requests.
func TestRestartedEngineReleasesTheLedger(t *testing.T) {
	c := ledgerCore(t)
	scrape(c, ms(10), 0, 0, 5000)
	g := grantNow(t, c, ms(11), 512)
	c.Release(g, EventDone)
	scrape(c, ms(20), 3, 3, 10) // counter back from 5000 to 10
	if e := endpointState(c); e.ActivePrefill != 0 || e.AwaitingEngine != 0 {
		t.Fatalf("after a restart: %+v, want nothing charged", e)
	}
}

// TestPredictionReleasesBetweenScrapes: with a prefill rate learned from
// the counter, the oldest awaiting grant is released once the engine had
// time to prefill it, and the core asks to be driven then while
// requests are queued.
func TestPredictionReleasesBetweenScrapes(t *testing.T) {
	c := ledgerCore(t)
	// Learn 100,000 tokens/s over an interval with work queued at both
	// ends (our grants await the engine).
	warm := grantNow(t, c, ms(1), 1000)
	c.Release(warm, EventDone)
	scrape(c, ms(10), 0, 1, 0)
	scrape(c, ms(20), 0, 1, 1000) // 1000 tokens in 10 ms
	if e := endpointState(c); e.PrefillRate != 100000 || e.AwaitingEngine != 0 {
		t.Fatalf("after the warm-up: %+v, want rate 100000 and nothing awaiting", e)
	}
	// Four prompts of 500 fill the endpoint past 1536; a fifth queues.
	var gs []*Grant
	for range 4 {
		gs = append(gs, grantNow(t, c, ms(21), 500))
	}
	queued := admit(c, ms(21), &Ticket{RawISL: 500})
	if l := c.Drain(ms(21)); len(l) != 0 {
		t.Fatalf("fifth request: %v, want it queued", l)
	}
	for _, g := range gs {
		c.Release(g, EventDone)
	}
	// 500 tokens at 100,000/s take 5 ms: the first is done at 26 ms.
	if at, ok := c.NextDeadline(); !ok || at != ms(26) {
		t.Fatalf("NextDeadline = %d, %t; want %d (the first predicted prefill end)", at, ok, ms(26))
	}
	if l := c.Drain(ms(25)); len(l) != 0 || endpointState(c).AwaitingEngine != 4 {
		t.Fatalf("at 25 ms: %v, %+v; want nothing released yet", l, endpointState(c))
	}
	l := c.Drain(ms(26))
	if len(l) != 1 || l[0].Req != queued || l[0].Grant == nil {
		t.Fatalf("at 26 ms: %v, want the queued request granted", l)
	}
	if e := endpointState(c); e.AwaitingEngine != 3 || e.ActivePrefill != 2000 {
		t.Fatalf("at 26 ms: %+v, want 3 awaiting and 2000 tokens (3 awaiting + the new grant)", e)
	}
	// The next scrape says the engine did only that one: nothing more is
	// released, and what prediction released is not credited twice.
	scrape(c, ms(30), 2, 2, 1500)
	if e := endpointState(c); e.AwaitingEngine != 3 {
		t.Fatalf("after a scrape that confirms the prediction only: %+v, want 3 awaiting", e)
	}
}

// TestWithoutMetricsTheStreamEndReleases: with scraping off there is no
// engine to reconcile against, so a stream's end returns its charge, as
// it always did.
func TestWithoutMetricsTheStreamEndReleases(t *testing.T) {
	c := newCore(t, byHeader(1536, class("standard", 512, 0)), Options{}, ep1)
	g := grantNow(t, c, 0, 512)
	c.Release(g, EventDone)
	if e := endpointState(c); e.ActivePrefill != 0 || e.AwaitingEngine != 0 {
		t.Fatalf("%+v: want nothing charged", e)
	}
}

// TestCancelledGrantNeverAwaits: a grant its caller never received never
// reached the engine.
func TestCancelledGrantNeverAwaits(t *testing.T) {
	c := ledgerCore(t)
	r := admit(c, ms(1), &Ticket{RawISL: 512})
	c.Drain(ms(1))
	c.Cancel(r)
	if e := endpointState(c); e.ActivePrefill != 0 || e.AwaitingEngine != 0 || e.InFlight != 0 {
		t.Fatalf("%+v: want nothing charged", e)
	}
}
