package sched

import (
	"testing"

	"github.com/laneway-dev/laneway/pkg/podmetrics"
)

// ledgerCore is a core with one endpoint whose metrics are expected, made
// fresh by a first scrape at time 0 with the engine's counters at 0.
func ledgerCore(t *testing.T) *Core {
	t.Helper()
	c := newCore(t, byHeader(1536, class("standard", 512, 0)), Options{ExpectMetrics: true}, ep1)
	counted(c, 0, 0, 0, 0)
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

// counted delivers a fresh scrape of ep1 at now that counts the engine's
// arrivals: waiting, running and finished requests, and the prompt-token
// counter at 0.
func counted(c *Core, now int64, waiting, running int, finished float64) {
	countedPrefill(c, now, waiting, running, finished, 0)
}

// countedPrefill is counted with the prompt-token counter at
// promptTokens.
func countedPrefill(c *Core, now int64, waiting, running int, finished, promptTokens float64) {
	c.SetMetrics(now, ep1, podmetrics.Metrics{
		Known:   podmetrics.Waiting | podmetrics.Running | podmetrics.PromptTokens | podmetrics.Finished,
		Waiting: waiting, Running: running, Finished: finished, PromptTokens: promptTokens,
	}, false)
}

// ledgerOf is ep1's ledger, for what the snapshot does not show.
func ledgerOf(c *Core) *ledger { return &c.reg.byAddr[ep1].led }

// warmShare sets ep1's share as if measured over full windows: the
// engine's arrivals since the first count no longer set it.
func warmShare(c *Core, share float64) {
	l := ledgerOf(c)
	l.share, l.shareSampled = share, true
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
// ends the stream at the pick; the request may still be on its way to the
// engine, so its tokens stay charged until a scrape shows it arrived:
// sent arrivalSlack before the scrape, and among the engine's arrivals.
func TestStreamEndWithoutFirstByteKeepsTheCharge(t *testing.T) {
	c := ledgerCore(t)
	warmShare(c, 1) // measured alone: every arrival may be ours
	a := grantNow(t, c, ms(1), 512)
	b := grantNow(t, c, ms(5), 512)
	c.Release(a, EventDone)
	c.Release(b, EventDone)
	if e := endpointState(c); e.ActivePrefill != 1024 || e.AwaitingEngine != 2 || e.InFlight != 0 {
		t.Fatalf("after both streams ended: %+v, want 1024 tokens charged, 2 awaiting, none in flight", e)
	}
	// Delivered 7 ms after b was sent, the engine counting both: b may
	// have arrived after the page was rendered, so it stays charged (and
	// is counted in the queue too, until the next scrape).
	counted(c, ms(12), 2, 0, 0)
	if e := endpointState(c); e.ActivePrefill != 512 || e.AwaitingEngine != 1 || e.UnseenWaiting != 2 {
		t.Fatalf("7 ms after b: %+v, want b still charged, both waiting in the engine's count", e)
	}
	// The arrival a took at 12 ms was b's; an arrival counted while b
	// was too recent to be taken is not kept for it (it may have been
	// another replica's), so b waits for the next one.
	counted(c, ms(50), 2, 0, 0)
	if e := endpointState(c); e.AwaitingEngine != 1 {
		t.Fatalf("no new arrival: %+v, want b awaiting", e)
	}
	counted(c, ms(100), 2, 1, 0)
	if e := endpointState(c); e.ActivePrefill != 0 || e.AwaitingEngine != 0 || e.UnseenWaiting != 2 {
		t.Fatalf("another arrival: %+v, want both carried by the engine's count", e)
	}
}

// TestArrivalsBoundTheLedger: a grant sent in time to arrive is taken as
// arrived only as far as the engine counted arrivals (waiting + running +
// finished requests); the others are still on their way, which on a
// loaded node can take hundreds of milliseconds.
func TestArrivalsBoundTheLedger(t *testing.T) {
	c := ledgerCore(t)
	warmShare(c, 1) // measured alone
	for i := range 3 {
		c.Release(grantNow(t, c, ms(int64(1+i)), 500), EventDone)
	}
	counted(c, ms(50), 0, 1, 0) // one arrived
	if e := endpointState(c); e.ActivePrefill != 1000 || e.AwaitingEngine != 2 {
		t.Fatalf("one arrival: %+v, want 2 awaiting, 1000 tokens", e)
	}
	counted(c, ms(100), 0, 0, 1) // it finished; nothing new arrived
	if e := endpointState(c); e.AwaitingEngine != 2 {
		t.Fatalf("no new arrival: %+v, want 2 awaiting", e)
	}
	counted(c, ms(150), 1, 0, 2) // two more: one waiting, one done
	if e := endpointState(c); e.ActivePrefill != 0 || e.AwaitingEngine != 0 || e.UnseenWaiting != 1 {
		t.Fatalf("all arrived: %+v, want nothing charged and one waiting in the engine's count", e)
	}
}

// TestWithoutArrivalsTimeAlone: an engine with no finished-request
// counter (its arrivals unknown) carries a grant from the first scrape
// delivered arrivalSlack after it was sent.
func TestWithoutArrivalsTimeAlone(t *testing.T) {
	c := ledgerCore(t)
	for i := range 3 {
		c.Release(grantNow(t, c, ms(int64(1+i)), 500), EventDone)
	}
	counts := func(now int64, waiting int) {
		c.SetMetrics(now, ep1, podmetrics.Metrics{Known: podmetrics.Waiting | podmetrics.Running, Waiting: waiting}, false)
	}
	counts(ms(12), 0)
	if e := endpointState(c); e.AwaitingEngine != 1 {
		t.Fatalf("scraped 9 ms after the last: %+v, want it awaiting, the two before carried", e)
	}
	counts(ms(20), 1)
	if e := endpointState(c); e.ActivePrefill != 0 || e.AwaitingEngine != 0 || e.UnseenWaiting != 1 {
		t.Fatalf("17 ms after the last: %+v, want nothing charged", e)
	}
}

// TestChargedGrantsAreNotCountedTwice: a grant whose stream is open and
// whose first byte has not come is charged, and may be in the engine's
// queue: the queue's count less such grants is the unseen load.
func TestChargedGrantsAreNotCountedTwice(t *testing.T) {
	c := ledgerCore(t)
	exact := grantNow(t, c, ms(1), 512)
	header := grantNow(t, c, ms(2), 512)
	c.Release(header, EventDone) // a header-only stream
	counted(c, ms(50), 2, 0, 0)
	if e := endpointState(c); e.ActivePrefill != 512 || e.AwaitingEngine != 0 || e.UnseenWaiting != 1 {
		t.Fatalf("%+v: want the open grant charged and the header-only one counted in the queue", e)
	}
	c.Release(exact, EventFirstByte)
	c.Release(exact, EventDone)
	counted(c, ms(100), 0, 2, 0)
	if e := endpointState(c); e.ActivePrefill != 0 || e.UnseenWaiting != 0 {
		t.Fatalf("%+v: want nothing left", e)
	}
}

// TestShareOfArrivals: another replica in front of the same engine
// grows the same counts. Our share of the engine's arrivals, measured
// over windows in which the engine had requests waiting at every scrape,
// is what we sent over what arrived; only that part of an arrival is
// matched to our grants, and what is left over carries to the next
// scrape while grants wait.
func TestShareOfArrivals(t *testing.T) {
	c := ledgerCore(t) // a window opens with the engine's queue empty
	warmShare(c, 1)
	l := ledgerOf(c)
	for i := range 2 {
		c.Release(grantNow(t, c, ms(int64(1+i)), 512), EventDone)
	}
	counted(c, ms(100), 1, 7, 0) // 8 arrived: two of them ours
	counted(c, ms(500), 1, 7, 0)
	if l.share != 1 {
		t.Fatalf("after a window that began with the queue empty: share %v, want 1 (no sample: what was sent may be on its way)", l.share)
	}
	for i := range 2 {
		c.Release(grantNow(t, c, ms(int64(501+i)), 512), EventDone)
	}
	counted(c, ms(700), 1, 7, 8) // 8 more arrived: two of them ours
	counted(c, ms(1000), 1, 7, 8)
	if want := 1 + shareEWMA*(0.25-1); l.share != want || l.len() != 0 {
		t.Fatalf("after a full window with 2 of 8 arrivals ours: share %v, %d awaiting; want %v, none", l.share, l.len(), want)
	}
	for i := range 3 {
		counted(c, ms(int64(1100+100*i)), 0, 8, 8) // a window that closes with no arrival leaves the share
	}
	l.shareKnown = false // a new window
	warmShare(c, 0.5)
	g := grantNow(t, c, ms(1401), 512)
	c.Release(g, EventDone)
	counted(c, ms(1500), 0, 8, 9) // one arrival: half of it ours
	if l.len() != 1 || l.carry != 0.5 {
		t.Fatalf("one arrival at share 0.5: %d awaiting, carry %v; want 1, 0.5", l.len(), l.carry)
	}
	counted(c, ms(1600), 0, 8, 10) // another: a whole one with the carry
	if l.len() != 0 || l.carry != 0 {
		t.Fatalf("a second arrival: %d awaiting, carry %v; want none, 0", l.len(), l.carry)
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
// the counter, the engine's queue drains between scrapes: first the
// unseen requests the scrape counted, then the awaiting grants, oldest
// first, none before it was sent; the core asks to be driven at each
// predicted prefill end while requests are queued. Prediction runs at
// most a busy test's worth of grants ahead of the engine's counts.
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
	// Scraped a millisecond after they were sent: still awaiting. 500
	// tokens at 100,000/s take 5 ms: the first is predicted done at 507
	// ms, from the scrape.
	scrape(c, ms(502), 0, 0, 50000)
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
	// Three predicted (1500 tokens) and the fourth would take prediction
	// past the busy limit ahead of the engine's counts: it waits for a
	// scrape.
	c.Drain(ms(600))
	if e := endpointState(c); e.AwaitingEngine != 1 {
		t.Fatalf("at 600 ms: %+v, want the fourth still awaiting", e)
	}
	if _, ok := c.NextDeadline(); ok {
		t.Fatal("NextDeadline with prediction at its lead: want none (no queued request's budget either)")
	}
	// A scrape shows two requests waiting: the engine's count carries
	// everything sent before it, less the grant whose stream is open
	// (charged, and maybe one of the two).
	scrape(c, ms(610), 2, 2, 51500)
	if e := endpointState(c); e.AwaitingEngine != 0 || e.UnseenWaiting != 1 || e.ActivePrefill != 500 {
		t.Fatalf("at 610 ms: %+v, want nothing awaiting, 1 unseen and the open grant charged", e)
	}
}

// TestLostGrantsAndQuietEngines: a grant the engine's arrivals never
// covered is taken as arrived (or lost: the client left, the proxy
// failed) after maxTransit, or once the engine has held nothing and
// counted no arrival for quietCatchUp since a scrape after it was sent.
func TestLostGrantsAndQuietEngines(t *testing.T) {
	t.Run("busy engine", func(t *testing.T) {
		c := ledgerCore(t)
		counted(c, ms(1), 0, 1, 0) // a stranger runs: not quiet
		c.Release(grantNow(t, c, ms(2), 512), EventDone)
		counted(c, ms(100), 0, 1, 0)
		counted(c, ms(3001), 0, 1, 0)
		if e := endpointState(c); e.AwaitingEngine != 1 {
			t.Fatalf("2.999 s: %+v, want the grant awaiting", e)
		}
		counted(c, ms(3002), 0, 1, 0)
		if e := endpointState(c); e.AwaitingEngine != 0 || e.ActivePrefill != 0 {
			t.Fatalf("3 s: %+v, want the grant given up", e)
		}
	})
	t.Run("quiet engine", func(t *testing.T) {
		c := ledgerCore(t)
		warmShare(c, 0.5) // another replica's requests arrive too
		c.Release(grantNow(t, c, ms(1), 512), EventDone)
		counted(c, ms(50), 0, 1, 0)  // it arrived, but 0.55 of an arrival is ours
		counted(c, ms(100), 0, 0, 1) // quiet since the scrape at 50 ms
		counted(c, ms(500), 0, 0, 1)
		if e := endpointState(c); e.AwaitingEngine != 1 {
			t.Fatalf("quiet for 450 ms: %+v, want the grant awaiting", e)
		}
		c.Release(grantNow(t, c, ms(510), 512), EventDone)
		counted(c, ms(560), 0, 0, 1)
		if e := endpointState(c); e.AwaitingEngine != 1 || e.ActivePrefill != 512 {
			t.Fatalf("quiet for 510 ms: %+v, want only the grant sent during the quiet awaiting", e)
		}
	})
}

// TestQuietEngineHoldsWhatItNeverCounted: an engine that goes quiet
// takes the grants sent before as arrived only as far as its arrival
// count could hold them. Here it counted no arrival since the picker's
// first count (the one request it ran was there before), so the three
// grants are all still on their way, held by a stalled gateway; taken as
// arrived after quietCatchUp, they were sent again on top of themselves,
// and a gateway stalled for over a second on a saturated node landed
// both waves together (engine waiting 21 and 27 in TestTwoPickersOneEngine
// beside a two-worker fuzz run). They go at maxTransit, as lost ones do.
func TestQuietEngineHoldsWhatItNeverCounted(t *testing.T) {
	c := newCore(t, byHeader(1536, class("standard", 512, 0)), Options{ExpectMetrics: true}, ep1)
	counted(c, 0, 0, 1, 0) // the first count: one request running
	for i := range int64(3) {
		c.Release(grantNow(t, c, ms(50+i), 512), EventDone)
	}
	counted(c, ms(100), 0, 1, 0)
	for now := int64(200); now <= 3000; now += 100 {
		counted(c, ms(now), 0, 0, 1) // it finished; quiet since the scrape at 100 ms
		if e := endpointState(c); e.AwaitingEngine != 3 {
			t.Fatalf("at %d ms, the engine quiet and counting nothing of ours: %d awaiting, want 3", now, e.AwaitingEngine)
		}
	}
	counted(c, ms(3100), 0, 0, 1)
	if e := endpointState(c); e.AwaitingEngine != 0 || e.ActivePrefill != 0 {
		t.Fatalf("past maxTransit: %+v, want the grants given up", e)
	}
}

// TestAbortsKeepTheLedger: a request whose client went away leaves the
// engine's queues without being counted finished (vLLM's
// request_success_total counts no abort), so the engine's arrivals go
// back by one. With its prompt-token counter still counting on, that is
// not a restart: the grants on their way stay awaiting, and the share
// measured over full windows stays. (Taken for a restart, one abort
// released every awaiting grant and sent the picker back to the cold
// share.)
func TestAbortsKeepTheLedger(t *testing.T) {
	c := ledgerCore(t)
	warmShare(c, 0.5)
	l := ledgerOf(c)
	countedPrefill(c, ms(100), 1, 1, 0, 1000) // two strangers
	for i := range int64(3) {
		c.Release(grantNow(t, c, ms(110+i), 100), EventDone)
	}
	countedPrefill(c, ms(200), 0, 1, 0, 1000) // the waiting one's client went away
	if e := endpointState(c); e.AwaitingEngine != 3 || l.share != 0.5 || !l.shareSampled {
		t.Fatalf("after an abort: %d awaiting, share %v (sampled %t); want 3, 0.5 (sampled)", e.AwaitingEngine, l.share, l.shareSampled)
	}
	countedPrefill(c, ms(300), 2, 1, 0, 1000) // two of ours arrive: one is ours by the share
	if e := endpointState(c); e.AwaitingEngine != 2 {
		t.Fatalf("two arrivals at share 0.5: %d awaiting, want 2", e.AwaitingEngine)
	}
	countedPrefill(c, ms(400), 0, 0, 0, 0) // the counter went back: a restart
	if e := endpointState(c); e.AwaitingEngine != 0 {
		t.Fatalf("after a restart: %d awaiting, want none", e.AwaitingEngine)
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

// TestStrangersLeavePrefill: requests another replica sent wait in the
// engine's queue (unseen load); between scrapes they leave prefill at the
// engine's learned rate times our share of it, so the busy test does not
// hold our queue for a whole scrape interval on a queue the engine has
// long emptied (found by TestTwoPickersOneEngine: one picker held 250
// requests for 3 s on three strangers seen at every scrape, each of them
// sent by the other picker just before it, and gone 25 ms later). A
// picker with nothing in the engine still takes a quarter of the rate,
// so the others cannot crowd it out. The next scrape's count wins over
// the prediction.
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
	// Each stranger's prompt takes mean/25,000 s, one after the other:
	// at the engine's rate times our share of it, no less than a quarter
	// (minPredictShare) for a picker with nothing in the engine.
	d := int64((float64(mean)/(100000*minPredictShare))*1e9 + 0.5)
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

// TestIntervalLeadOnlyWhenStarving: while the last scrape found the
// engine's queue empty, prediction may run a scrape interval's prefill
// ahead (at a small busy limit the engine would otherwise idle between
// scrapes), but only if nothing we sent is held up on its way: a grant
// sent a scrape interval ago that the engine's arrivals have not shown
// means a gateway holds our requests, the queue is empty because of
// that, and what prediction released would land together with them
// (found by TestTwoPickersOneEngine: two pickers each with 4 grants held
// and 4 predicted ahead while slow gateways held them, engine waiting 10
// and 11).
func TestIntervalLeadOnlyWhenStarving(t *testing.T) {
	c := ledgerCore(t)
	warmShare(c, 1) // measured alone
	counts := func(now int64, finished, promptTokens float64) { countedPrefill(c, now, 0, 0, finished, promptTokens) }
	// The engine prefills 100,000 tokens/s, scraped every 100 ms.
	for i := int64(1); i <= 12; i++ {
		counts(ms(100*i), 0, float64(10000*i))
	}
	e, l := c.reg.byAddr[ep1], ledgerOf(c)
	// A scrape interval's prefill less the busy limit's worth, which the
	// busy test keeps charged and on its way as well.
	starving := func() uint64 { return uint64(l.rate*float64(l.interval)/1e9) - 1536 }
	if l.rate != 100000 || starving() != 8464 || c.predictionLead(e) != starving() {
		t.Fatalf("an idle engine: rate %v, lead %d; want 100000 and a scrape interval's prefill less the 1536 limit, %d", l.rate, c.predictionLead(e), starving())
	}
	c.Release(grantNow(t, c, ms(1220), 512), EventDone) // on its way, header-only
	counts(ms(1300), 0, 120000)
	if l.len() != 1 || c.predictionLead(e) != starving() {
		t.Fatalf("a grant sent 80 ms ago, not arrived: %d awaiting, lead %d; want 1, %d (it may arrive any moment)", l.len(), c.predictionLead(e), starving())
	}
	counts(ms(1400), 0, 120000)
	if l.len() != 1 || c.predictionLead(e) != 1536 {
		t.Fatalf("a grant sent 180 ms ago, not arrived: %d awaiting, lead %d; want 1, the busy limit 1536 (held up on its way)", l.len(), c.predictionLead(e))
	}
	counts(ms(1500), 1, 120512) // it arrived, and was served
	if l.len() != 0 || c.predictionLead(e) != starving() {
		t.Fatalf("the grant arrived: %d awaiting, lead %d; want none, %d", l.len(), c.predictionLead(e), starving())
	}
}

// TestScrapeIntervalIsAMedian: one scrape delayed on a loaded node does
// not stretch the interval the empty-queue lead covers (a smoothed mean
// went from 101 to 211 ms over one 540 ms gap, and the lead from 8 to 16
// requests); a lasting change does.
func TestScrapeIntervalIsAMedian(t *testing.T) {
	c := ledgerCore(t)
	l := ledgerOf(c)
	now := int64(0)
	step := func(gaps ...int64) {
		for _, g := range gaps {
			now += ms(g)
			countedPrefill(c, now, 0, 0, 0, 0)
		}
	}
	for _, tc := range []struct {
		name string
		gaps []int64
		want int64
	}{
		{"first gap", []int64{100}, 100},
		{"steady", []int64{100, 100, 100, 100}, 100},
		{"one delayed scrape", []int64{540}, 100},
		{"two delayed", []int64{400}, 100},
		{"most of the last five slow", []int64{300}, 300},
		{"back to fast", []int64{100, 100, 100}, 100},
	} {
		step(tc.gaps...)
		if l.interval != ms(tc.want) {
			t.Errorf("%s: interval %v ms, want %d", tc.name, float64(l.interval)/1e6, tc.want)
		}
	}
}

// TestColdShare: a picker that has measured no full window takes
// coldShare of the engine's arrivals, as if one other replica sent as
// much as it does, until the counts show it alone: aloneStillScrapes fresh
// scrapes in a row with no new arrival and exactly as many arrivals
// since the first count as it sent. Then every grant it sent is in the
// engine's counts, but the share stays cold and the counts start again:
// one pass can be a coincidence. After a second pass its share is 1
// until the engine counts more arrivals than it sent since the first
// pass; then what it sent over what arrived. The first
// full window's sample moves the share from there, and the counts since
// the start no longer set it. (Taken as 1 from the start, two pickers
// that start together behind slow gateways each took the other's
// arrivals for their own: TestTwoPickersOneEngine run cold.)
func TestColdShare(t *testing.T) {
	c := ledgerCore(t)
	l := ledgerOf(c)
	for i := range 4 {
		c.Release(grantNow(t, c, ms(int64(1+i)), 100), EventDone)
	}
	counted(c, ms(100), 0, 3, 0) // 3 arrivals of the 4 sent: ours or another's
	if l.share != coldShare || l.len() != 3 || l.carry != 0.5 {
		t.Fatalf("3 arrivals, 4 sent: share %v, %d awaiting, carry %v; want %v, 3, 0.5", l.share, l.len(), l.carry, coldShare)
	}
	counted(c, ms(200), 1, 3, 0) // 4 arrivals of the 4 sent
	for i := 3; i <= 4; i++ {
		counted(c, ms(int64(100*i)), 1, 3, 0)
	}
	if l.share != coldShare || l.len() != 2 {
		t.Fatalf("still for two scrapes: share %v, %d awaiting; want %v, 2", l.share, l.len(), coldShare)
	}
	counted(c, ms(500), 1, 3, 0)
	if l.share != coldShare || l.len() != 0 {
		t.Fatalf("still for %d scrapes, as many arrivals as we sent: share %v, %d awaiting; want %v (one pass may be a coincidence), none", aloneStillScrapes, l.share, l.len(), coldShare)
	}
	// The counts start again from the first pass: two more grants, and
	// the engine counts exactly those.
	for i := range 2 {
		c.Release(grantNow(t, c, ms(int64(510+10*i)), 100), EventDone)
	}
	counted(c, ms(600), 2, 4, 0)
	if l.share != coldShare || l.len() != 1 {
		t.Fatalf("2 arrivals of the 2 sent since the first pass: share %v, %d awaiting; want %v, 1", l.share, l.len(), coldShare)
	}
	for i := 1; i <= aloneStillScrapes; i++ {
		counted(c, ms(int64(600+50*i)), 2, 4, 0)
	}
	if l.share != 1 || l.len() != 0 {
		t.Fatalf("a second pass: share %v, %d awaiting; want 1 (alone), none", l.share, l.len())
	}
	counted(c, ms(800), 3, 4, 2) // 5 arrivals since the first pass, 2 sent
	if l.share != 2.0/5 {
		t.Fatalf("5 arrivals, 2 sent: share %v, want 2/5", l.share)
	}
	counted(c, ms(900), 3, 4, 8)
	if l.share != 2.0/11 || l.shareSampled {
		t.Fatalf("11 arrivals, 2 sent: share %v, sampled %t; want 2/11, not sampled", l.share, l.shareSampled)
	}
	counted(c, ms(1000), 3, 4, 9) // a full window since 500 ms: 12 arrivals, 2 ours
	want := 2.0/11 + shareEWMA*(2.0/12-2.0/11)
	if l.share != want || !l.shareSampled {
		t.Fatalf("after a full window with 2 of 12 arrivals ours: share %v, want %v, sampled", l.share, want)
	}
	counted(c, ms(1100), 3, 4, 10)
	if l.share != want {
		t.Fatalf("sampled: share %v, want %v (no longer the counts since the start)", l.share, want)
	}
}

// TestQuietEngineMeasuresTheShareAgain: grants a share measured beside
// another replica left held until the engine went quiet, twice with no
// full window between, mean this replica's own arrivals keep going
// unmatched (the others stopped sending): the share is measured again
// from there, as at a cold start. Without this a replica left alone at a
// share of 0.36 matched a third of its arrivals and served about 8
// requests a second (TestTwoPickersOneEngine run cold).
func TestQuietEngineMeasuresTheShareAgain(t *testing.T) {
	c := ledgerCore(t)
	warmShare(c, 0.4)
	l := ledgerOf(c)
	finished, now := 0.0, int64(0)
	// burst sends n grants that all arrive and finish by the next scrape,
	// then leaves the engine quiet past quietCatchUp.
	burst := func(n int) {
		for i := range n {
			c.Release(grantNow(t, c, now+ms(int64(1+i)), 100), EventDone)
		}
		finished += float64(n)
		for _, step := range []int64{100, 100, 600} {
			now += ms(step)
			counted(c, now, 0, 0, finished)
		}
	}
	burst(3)
	if l.len() != 0 || l.share != 0.4 || !l.shareSampled {
		t.Fatalf("after one quiet catch-up: %d awaiting, share %v, sampled %t; want none, 0.4 (kept), sampled", l.len(), l.share, l.shareSampled)
	}
	burst(3)
	now += ms(100)
	counted(c, now, 0, 0, finished)
	if l.len() != 0 || l.share != coldShare || l.shareSampled {
		t.Fatalf("after a second: %d awaiting, share %v, sampled %t; want none, %v (measured again), not sampled", l.len(), l.share, l.shareSampled, coldShare)
	}
	for pass, want := range []float64{coldShare, 1} {
		for i := range 3 {
			c.Release(grantNow(t, c, now+ms(int64(1+i)), 100), EventDone)
		}
		for range 1 + aloneStillScrapes {
			now += ms(100)
			counted(c, now, 0, 3, finished) // the three arrived, and nothing else
		}
		if l.len() != 0 || l.share != want {
			t.Fatalf("pass %d: the engine counts the three we sent, and no more: %d awaiting, share %v; want none, %v", pass+1, l.len(), l.share, want)
		}
		finished += 3
	}
	now += ms(100)
	counted(c, now, 0, 0, finished)
	c.Release(grantNow(t, c, now+ms(1), 100), EventDone)
	now += ms(100)
	counted(c, now, 0, 0, finished+4) // 4 arrivals against our 1
	if l.share != 4.0/7 {
		t.Fatalf("another replica sends again: share %v, want 4/7 (sent over arrived since measured again)", l.share)
	}
}

// TestColdShareAloneInFlow: a lone picker behind a quick gateway keeps
// sending between scrapes and never lets the engine go still, but the
// engine counts everything it sent at every scrape: after
// aloneEvenScrapes such scrapes in a row the grants the half share held
// are released, and after as many again it is alone, at share 1. (Held
// at coldShare instead, the demo's header-only workload took 28 to 36 s
// against 9.)
func TestColdShareAloneInFlow(t *testing.T) {
	c := ledgerCore(t)
	l := ledgerOf(c)
	for i := 1; i <= 2*aloneEvenScrapes; i++ {
		now := ms(int64(100 * i))
		c.Release(grantNow(t, c, now-ms(50), 100), EventDone)
		counted(c, now, 0, 1, float64(i-1)) // it arrived; the one before finished
		switch {
		case i == aloneEvenScrapes:
			if l.share != coldShare || l.len() != 0 {
				t.Fatalf("after %d scrapes counting exactly what we sent: share %v, %d awaiting; want %v (one pass), none", i, l.share, l.len(), coldShare)
			}
		case i < 2*aloneEvenScrapes:
			if l.share != coldShare || l.len() == 0 {
				t.Fatalf("scrape %d: share %v, %d awaiting; want %v and the half share holding some", i, l.share, l.len(), coldShare)
			}
		}
	}
	if l.share != 1 || l.len() != 0 {
		t.Fatalf("after %d more: share %v, %d awaiting; want 1 (alone), none", aloneEvenScrapes, l.share, l.len())
	}
}

// TestAwaitingGrantsCountOthersOnTheirWay: a grant awaiting the engine's
// confirmation may still be on its way there, and so may the other
// replicas' grants, which no count shows yet; at a share below 1,
// measured over a full window, the busy test counts the awaiting charge
// as if they sent in proportion (at most half as much again, see
// othersOnTheirWay). Open streams keep their exact charge (a gateway
// with response phases); a replica alone, or at the cold share, counts
// only its own.
func TestAwaitingGrantsCountOthersOnTheirWay(t *testing.T) {
	for _, tc := range []struct {
		name       string
		share      float64 // 0: cold (coldShare)
		headerOnly bool
		wantLoad   uint64 // after three grants of 512 tokens
	}{
		{name: "cold, header-only", headerOnly: true, wantLoad: 1536},
		{name: "half, header-only", share: 0.5, headerOnly: true, wantLoad: 1536 + 768},
		{name: "0.8, header-only", share: 0.8, headerOnly: true, wantLoad: 1536 + 384},
		{name: "alone, header-only", share: 1, headerOnly: true, wantLoad: 1536},
		{name: "cold, response phases", wantLoad: 1536},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ledgerCore(t)
			if tc.share > 0 {
				warmShare(c, tc.share)
			}
			for i := range int64(3) {
				g := grantNow(t, c, ms(1+i), 512)
				if tc.headerOnly {
					c.Release(g, EventDone)
				}
			}
			if load := c.reg.byAddr[ep1].load(); load != tc.wantLoad {
				t.Fatalf("busy-test load after three grants: %d, want %d", load, tc.wantLoad)
			}
			// The threshold is 1536: a fourth request goes only if the
			// load is not over it.
			admit(c, ms(5), &Ticket{RawISL: 512})
			granted := len(c.Drain(ms(5))) == 1
			if want := tc.wantLoad <= 1536; granted != want {
				t.Fatalf("fourth request granted %t, want %t", granted, want)
			}
		})
	}
}

// TestRisingShareWakesTheQueue: a scrape that measures a larger share
// shrinks the others on their way without releasing a grant or moving
// the unseen estimate; a request held only by that term must go at that
// scrape, not at the next event.
func TestRisingShareWakesTheQueue(t *testing.T) {
	c := ledgerCore(t) // the share's window opens with the queue empty
	warmShare(c, 0.6)
	// Our open stream (response phases) is the request the engine holds.
	admit(c, ms(400), &Ticket{RawISL: 100})
	if l := c.Drain(ms(400)); len(l) != 1 || l[0].Grant == nil {
		t.Fatalf("first request: %v, want a direct grant", l)
	}
	counted(c, ms(500), 1, 0, 0) // closes the first window (not full) and opens a full one
	for i := range int64(3) {
		c.Release(grantNow(t, c, ms(991+i), 330), EventDone)
	}
	// 100 + 990 + 990/2 = 1585, over the threshold of 1536. Pinned (a
	// subset hint of one endpoint), it waits in the endpoint's exact
	// lane, whose verdict the queue keeps until the endpoint changes.
	held := admit(c, ms(994), &Ticket{RawISL: 330, Allow: []string{ep1}, HasAllow: true})
	if l := c.Drain(ms(994)); len(l) != 0 {
		t.Fatalf("fourth request at a measured share of 0.6: %s, want held", leaveString(l[0]))
	}
	// The three reached the engine and finished at once, within
	// arrivalSlack of this scrape: a full window with arrivals equal to
	// what we sent (share 0.6 -> 0.7), nothing confirmed, nothing unseen.
	counted(c, ms(1000), 1, 0, 3)
	e := endpointState(c)
	if load := c.reg.byAddr[ep1].load(); e.AwaitingEngine != 3 || e.OthersOnTheirWay != 424 || load != 1514 {
		t.Fatalf("after the window: %d awaiting, %d others on their way, load %d; want 3, 424, 1514", e.AwaitingEngine, e.OthersOnTheirWay, load)
	}
	if l := c.Drain(ms(1000)); len(l) != 1 || l[0].Grant == nil || held.Grant() == nil {
		t.Fatalf("fourth request after the share rose: %v, want granted at this scrape", l)
	}
}
