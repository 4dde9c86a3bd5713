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

// rateCore is ledgerCore after a warm-up that taught it a prefill rate of
// 100,000 tokens/s over a first window of half a second (one request of
// 1,000 tokens, released header-only, then an idle engine at 500 ms).
func rateCore(t *testing.T) *Core {
	t.Helper()
	c := ledgerCore(t)
	warm := grantNow(t, c, ms(1), 1000)
	c.Release(warm, EventDone)
	scrape(c, ms(10), 0, 1, 0)
	scrape(c, ms(500), 0, 0, 50000)
	if e := endpointState(c); e.PrefillRate != 100000 || e.AwaitingEngine != 0 {
		t.Fatalf("after the warm-up: %+v, want rate 100000 and nothing awaiting", e)
	}
	return c
}

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
// it dropped). Only grants sent before the previous scrape's delivery
// count: a later one may not have reached the engine yet.
func TestEngineCountsBoundTheLedger(t *testing.T) {
	c := ledgerCore(t)
	counts := func(now int64, waiting int) {
		c.SetMetrics(now, ep1, podmetrics.Metrics{Known: podmetrics.Waiting | podmetrics.Running, Waiting: waiting}, false)
	}
	var gs []*Grant
	for i := range 3 {
		gs = append(gs, grantNow(t, c, ms(int64(1+i)), 500))
	}
	for _, g := range gs {
		c.Release(g, EventDone)
	}
	// Scraped before the last two arrived: they are not missing yet.
	counts(ms(5), 1)
	if e := endpointState(c); e.AwaitingEngine != 3 {
		t.Fatalf("first scrape after the grants: %+v, want all 3 awaiting", e)
	}
	counts(ms(10), 1)
	if e := endpointState(c); e.ActivePrefill != 500 || e.AwaitingEngine != 1 {
		t.Fatalf("engine holds 1 request: %+v, want 1 awaiting, 500 tokens", e)
	}
	counts(ms(20), 0)
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
	c := rateCore(t)
	// Four prompts of 500 fill the endpoint past 1536; a fifth queues.
	var gs []*Grant
	for range 4 {
		gs = append(gs, grantNow(t, c, ms(501), 500))
	}
	queued := admit(c, ms(501), &Ticket{RawISL: 500})
	if l := c.Drain(ms(501)); len(l) != 0 {
		t.Fatalf("fifth request: %v, want it queued", l)
	}
	for _, g := range gs {
		c.Release(g, EventDone)
	}
	// The engine was seen idle at 500 ms, before the grants: their
	// prefill starts no earlier than they were sent.
	scrape(c, ms(502), 4, 0, 50000)
	// 500 tokens at 100,000/s take 5 ms: the first is done at 507 ms
	// (from the scrape at 502 ms, the last reconciliation).
	if at, ok := c.NextDeadline(); !ok || at != ms(507) {
		t.Fatalf("NextDeadline = %d, %t; want %d (the first predicted prefill end)", at, ok, ms(507))
	}
	if l := c.Drain(ms(506)); len(l) != 0 || endpointState(c).AwaitingEngine != 4 {
		t.Fatalf("at 506 ms: %v, %+v; want nothing released yet", l, endpointState(c))
	}
	l := c.Drain(ms(507))
	if len(l) != 1 || l[0].Req != queued || l[0].Grant == nil {
		t.Fatalf("at 507 ms: %v, want the queued request granted", l)
	}
	if e := endpointState(c); e.AwaitingEngine != 3 || e.ActivePrefill != 2000 {
		t.Fatalf("at 507 ms: %+v, want 3 awaiting and 2000 tokens (3 awaiting + the new grant)", e)
	}
	// The next scrape says the engine did only that one: nothing more is
	// released, and what prediction released is not credited twice.
	scrape(c, ms(510), 2, 2, 50500)
	if e := endpointState(c); e.AwaitingEngine != 3 {
		t.Fatalf("after a scrape that confirms the prediction only: %+v, want 3 awaiting", e)
	}
	// An engine seen idle has started none of them: prediction starts
	// over from that scrape.
	scrape(c, ms(520), 0, 0, 50500)
	c.Drain(ms(524))
	if e := endpointState(c); e.AwaitingEngine != 3 {
		t.Fatalf("4 ms after the engine was seen idle: %+v, want the 3 still awaited", e)
	}
	c.Drain(ms(525))
	if e := endpointState(c); e.AwaitingEngine != 2 {
		t.Fatalf("5 ms after the engine was seen idle: %+v, want one predicted done", e)
	}
}

// TestIdleEngineReleasesLostGrants: a grant the engine has not shown at
// any scrape for three seconds since it was sent (and since the engine
// went idle) was lost on the way: the client left, the proxy failed.
func TestIdleEngineReleasesLostGrants(t *testing.T) {
	c := ledgerCore(t)
	g := grantNow(t, c, ms(1), 512)
	c.Release(g, EventDone)
	scrape(c, ms(100), 0, 0, 0)
	scrape(c, ms(2900), 0, 0, 0)
	if e := endpointState(c); e.AwaitingEngine != 1 {
		t.Fatalf("idle for 2.9 s: %+v, want the grant still awaited", e)
	}
	late := grantNow(t, c, ms(2950), 512)
	c.Release(late, EventDone)
	scrape(c, ms(3100), 0, 0, 0)
	if e := endpointState(c); e.AwaitingEngine != 1 || e.ActivePrefill != 512 {
		t.Fatalf("3.1 s: %+v, want only the grant sent 0.15 s ago", e)
	}
	scrape(c, ms(3200), 1, 0, 0) // the engine holds a request: not idle
	scrape(c, ms(7000), 0, 0, 0)
	if e := endpointState(c); e.AwaitingEngine != 1 {
		t.Fatalf("idle again for an instant: %+v, want the grant still awaited", e)
	}
}

// TestRateWindowDampsBursts: engines count a batch's prompts at once and
// scrapes jitter, so a rate is measured over half a second at least, and
// one window at most doubles the rate; a saturated window lowers it
// smoothly.
func TestRateWindowDampsBursts(t *testing.T) {
	c := ledgerCore(t)
	keepBusy := grantNow(t, c, ms(1), 100)
	c.Release(keepBusy, EventDone)  // awaits: the engine has work throughout
	scrape(c, ms(500), 0, 1, 10000) // 20,000 tokens/s over the first window
	if r := endpointState(c).PrefillRate; r != 20000 {
		t.Fatalf("first window: rate %v, want 20000", r)
	}
	more := grantNow(t, c, ms(501), 100)
	c.Release(more, EventDone)
	scrape(c, ms(600), 0, 1, 10000)         // a short interval: no sample
	scrape(c, ms(1000), 0, 1, 10000+100000) // a burst: 200,000 tokens/s, counted as 40,000
	if r := endpointState(c).PrefillRate; r != 40000 {
		t.Fatalf("after a burst: rate %v, want 40000 (at most twice 20000)", r)
	}
	// A saturated window (requests waiting at every scrape) at 20,000
	// tokens/s moves it a quarter of the way down.
	scrape(c, ms(1500), 3, 1, 110000+20000) // closes a window that was not saturated throughout: 40,000/s, no change
	scrape(c, ms(1700), 3, 1, 130000+4000)
	scrape(c, ms(2000), 3, 1, 130000+10000)
	if r := endpointState(c).PrefillRate; r != 35000 {
		t.Fatalf("after a saturated window: rate %v, want 35000 (40000 - 0.25 x (40000 - 20000))", r)
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

// TestStrangersShareTheCounter: another replica in front of the same
// engine grows the same prompt-token counter. With two of ours awaiting
// and six strangers waiting in the engine, only ours / (ours + strangers)
// = 1/4 of the growth is ours: 2048 prefilled tokens release one 512-token
// grant, not both.
func TestStrangersShareTheCounter(t *testing.T) {
	c := ledgerCore(t)
	a := grantNow(t, c, ms(1), 512)
	b := grantNow(t, c, ms(2), 512)
	c.Release(a, EventDone)
	c.Release(b, EventDone)
	scrape(c, ms(50), 8, 4, 2048)
	if e := endpointState(c); e.ActivePrefill != 512 || e.AwaitingEngine != 1 {
		t.Fatalf("%+v: want one grant released by our quarter of the growth, b still charged", e)
	}
	// Without strangers waiting the whole growth is ours again.
	scrape(c, ms(100), 1, 4, 2560)
	if e := endpointState(c); e.ActivePrefill != 0 || e.AwaitingEngine != 0 {
		t.Fatalf("%+v: want b released", e)
	}
}

// TestStrangersLeavePrefill: requests another replica sent wait in the
// engine's queue (unseen load); between scrapes they leave prefill at the
// engine's learned rate like ours, so the busy test does not hold our
// queue for a whole scrape interval on a queue the engine has long
// emptied (found by TestTwoPickersOneEngine: one picker held 250
// requests for 3 s on three strangers seen at every scrape, each of them
// sent by the other picker just before it, and gone 25 ms later). The next
// scrape's count wins over the prediction.
func TestStrangersLeavePrefill(t *testing.T) {
	c := rateCore(t)
	// Three strangers wait: more than the threshold of unseen load.
	scrape(c, ms(600), 3, 1, 50000)
	e := endpointState(c)
	mean := e.UnseenPrefill / 3
	if e.UnseenWaiting != 3 || mean*3 <= 1536 {
		t.Fatalf("after the scrape: %+v, want 3 strangers over the threshold", e)
	}
	queued := admit(c, ms(600), &Ticket{RawISL: 500})
	if l := c.Drain(ms(600)); len(l) != 0 {
		t.Fatalf("with 3 strangers waiting: %v, want the request queued", l)
	}
	// Each stranger's prompt takes mean/100,000 s, one after the other.
	d := int64((float64(mean)/100000)*1e9 + 0.5)
	if at, ok := c.NextDeadline(); !ok || at < ms(600)+d-1 || at > ms(600)+d+1 {
		t.Fatalf("NextDeadline = %d, %t; want about %d (the first stranger's prefill end)", at, ok, ms(600)+d)
	}
	if c.Drain(ms(600) + d - 2); endpointState(c).UnseenWaiting != 3 {
		t.Fatalf("before the first stranger's prefill end: %+v, want 3", endpointState(c))
	}
	if l := c.Drain(ms(600) + d + 1); len(l) != 0 || endpointState(c).UnseenWaiting != 2 {
		t.Fatalf("after the first stranger's prefill end: %v, %+v; want 2 left and the request still queued", l, endpointState(c))
	}
	l := c.Drain(ms(600) + 2*d + 1)
	if len(l) != 1 || l[0].Req != queued || l[0].Grant == nil || endpointState(c).UnseenWaiting != 1 {
		t.Fatalf("after the second: %v, %+v; want the request granted with 1 stranger left", l, endpointState(c))
	}
	// The engine's own count wins at the next scrape.
	scrape(c, ms(700), 4, 1, 50000)
	if e := endpointState(c); e.UnseenWaiting != 3 {
		t.Fatalf("after a scrape showing 4 waiting, one of them ours: %+v, want 3 strangers", e)
	}
}
