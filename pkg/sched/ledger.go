package sched

import (
	"math"
	"time"

	"github.com/laneway-dev/laneway/pkg/drr"
	"github.com/laneway-dev/laneway/pkg/podmetrics"
)

// This file reconciles the picker's prefill accounting with the engine's
// own counters (SPEC §5, "Endpoint accounting"), so that the busy test
// holds behind gateways that report no response phases.
//
// A grant's charge normally returns at its first response byte. A grant
// whose stream ends first (a header-only gateway, Envoy with response
// phases skipped, a client that left) is still in the engine as far as
// the picker knows: it joins its endpoint's ledger, in the order the
// streams ended, and keeps its charge until one of these says its prompt
// left prefill, always the oldest first (engines prefill first come,
// first served):
//
//   - the engine's prompt-token counter (vLLM's and SGLang's
//     prompt_tokens_total grows by a request's whole prompt at the step
//     that finishes its prefill): at each scrape, the growth since the
//     last one, less the prompts whose first byte was reported and less
//     what prediction already released, is credited to the ledger's
//     oldest grants while it covers their prompts; of an engine whose
//     waiting queue holds strangers (another replica's requests), only our
//     share of the growth, ours / (ours + strangers);
//   - the engine's request counts: the ledger never holds more grants
//     than the engine has waiting and running requests;
//   - prediction between scrapes: with the prefill rate learned from the
//     counter (times the same share), the oldest grant is released once the engine had time to
//     prefill it after the ones before it (a grant cannot start before it
//     was sent). A prediction that runs ahead of the engine leaves its
//     request in the engine's waiting queue, where the unseen-load
//     estimate counts it at the next scrape.
//
// The unseen load (requests in the engine's queue this picker did not
// send, counted at each scrape) leaves prefill the same way between
// scrapes: one stranger's mean prompt at a time, at the learned rate times
// the strangers' part of the queue (1 − share), from the scrape that
// counted them. Without it a picker whose scrapes keep landing just after
// another replica's dispatches holds its whole queue on requests the
// engine empties within milliseconds. The next scrape's count replaces
// the prediction.
//
// The ledger is owned by the core's goroutine, like the rest of the
// endpoint; its cost is O(1) amortised per grant (each enters and leaves
// the queue once) plus O(E) per Drain for the endpoints holding grants or
// showing strangers.

// ledger is one endpoint's reconciliation state.
type ledger struct {
	// awaiting is the FIFO of grants whose stream ended before their first
	// byte; the queue is awaiting[head:].
	awaiting []*Grant
	head     int

	// The engine's prompt-token counter at the last fresh scrape that had
	// it.
	counterKnown bool
	counter      float64
	// unobserved is raw prompt tokens the picker counts as prefilled that
	// the counter has not shown yet: grants confirmed by a first byte (the
	// engine counts them too) and grants released by prediction. The
	// counter's growth pays it off before it credits awaiting grants, so
	// no prompt is counted twice, even when the engine reaches it only
	// after a later scrape.
	unobserved uint64
	// credit is prefilled tokens attributed to the oldest awaiting grant
	// but not yet enough to cover its prompt.
	credit uint64
	// rate is the learned prefill rate in prompt tokens per second, as the
	// counter counts them (0: not learned yet). It is measured over
	// windows of at least rateWindow starting at winAt with the counter
	// at winCounter; winBusy says the engine had requests waiting at
	// every scrape of the window so far.
	rate float64
	// share is the part of the engine's prefill that is ours, in (0, 1]:
	// 1 while the engine's waiting queue holds no more requests than we
	// may have there, else ours / (ours + strangers) at the last fresh
	// scrape. Another replica in front of the same engine (or a client
	// that bypasses the picker) grows the same counter, and a first come,
	// first served engine spends its prefill on everyone's requests in
	// turn; without the share every replica would take the whole growth,
	// and the whole rate, for its own grants and send twice what the
	// engine can take.
	share      float64
	winAt      int64
	winCounter float64
	winBusy    bool
	// anchor is when the oldest awaiting grant's prefill is assumed to
	// have started: the last reconciliation or the last prediction.
	anchor int64
	// blind: the last fresh scrape had nothing to reconcile against
	// (no request counts and no prompt-token counter).
	blind bool
	// scrapedAt is when the last fresh scrape was applied, if scraped.
	scrapedAt int64
	scraped   bool
	// idleSeenAt is the last fresh scrape that showed the engine holding
	// no request: a prefill cannot have started before it, so prediction
	// never counts a request on its way to an idle engine as prefilling.
	idleSeenAt int64
	// idleSince is when the engine's scrapes started showing no request
	// at all (-1: it holds some).
	idleSince int64
}

// arrivedBefore counts the awaiting grants sent before t: they had a
// whole scrape interval to reach the engine. Grants await in the order
// their streams ended, which is close to the order they were sent, so
// the count stops at the first later one. O(the count).
func (l *ledger) arrivedBefore(t int64) int {
	n := 0
	for _, g := range l.awaiting[l.head:] {
		if g.sentAt >= t {
			break
		}
		n++
	}
	return n
}

// newLedger is the state of an endpoint nothing was sent to yet.
func newLedger() ledger { return ledger{idleSince: -1, share: 1} }

// len is the number of grants awaiting the engine's confirmation.
func (l *ledger) len() int { return len(l.awaiting) - l.head }

// oldest is the oldest awaiting grant (the ledger must not be empty).
func (l *ledger) oldest() *Grant { return l.awaiting[l.head] }

func (l *ledger) push(g *Grant) { l.awaiting = append(l.awaiting, g) }

// pop removes the oldest awaiting grant and compacts the queue's storage
// once half of it is spent.
func (l *ledger) pop() *Grant {
	g := l.awaiting[l.head]
	l.awaiting[l.head] = nil
	l.head++
	if l.head == len(l.awaiting) {
		l.awaiting, l.head = l.awaiting[:0], 0
	} else if l.head >= 64 && l.head*2 >= len(l.awaiting) {
		n := copy(l.awaiting, l.awaiting[l.head:])
		clear(l.awaiting[n:])
		l.awaiting, l.head = l.awaiting[:n], 0
	}
	return g
}

// rateEWMA weighs a new prefill-rate sample: about the last four
// saturated windows count.
const rateEWMA = 0.25

// idleRelease is how long an engine must show no request at all after
// a grant was sent before the grant is taken as lost on its way to it.
// Generous: a request's way from the gateway to the engine can take a
// second on a starved node, and holding a lost grant costs only a little
// of the endpoint's admission for that long.
const idleRelease = int64(3 * time.Second)

// rateWindow is the shortest stretch of scrapes a prefill-rate sample
// spans. Engines count a whole batch's prompts at the step that ends
// their prefill, and deliveries jitter, so a single scrape interval can
// show several times the true rate; over half a second the step and the
// jitter are small next to the window.
const rateWindow = int64(500 * time.Millisecond)

// maxAwaiting bounds one endpoint's ledger: past it the oldest grant is
// released, so an engine that stops reporting cannot grow it forever
// (such an endpoint is stale, hence busy, anyway).
const maxAwaiting = 1 << 14

// await puts g, whose stream ended before its first byte, into e's
// ledger: its charge stays until the engine confirms its prefill. Without
// engine metrics to reconcile against (scraping off, or an engine whose
// page has neither request counts nor a prompt-token counter) the charge
// returns at once, as nothing could ever release it.
func (c *Core) await(e *endpoint, g *Grant) {
	if e.removed || !c.opts.ExpectMetrics || e.led.blind {
		c.prefillDone(g)
		return
	}
	if e.led.len() >= maxAwaiting {
		c.confirm(e)
	}
	if e.led.len() == 0 {
		e.led.anchor = g.sentAt
		e.led.credit = 0
		c.awaitingEps = append(c.awaitingEps, e)
	}

	e.led.push(g)
}

// confirm releases e's oldest awaiting grant: the engine says, or the
// prediction has it, that its prompt left prefill.
func (c *Core) confirm(e *endpoint) {
	c.prefillDone(e.led.pop())
}

// reconcile applies a fresh scrape's counters to e's ledger at now and
// reports whether a grant was released.
func (c *Core) reconcile(now int64, e *endpoint, m *podmetrics.Metrics) bool {
	l := &e.led
	before := l.len()
	prevAt, scrapedBefore := l.scrapedAt, l.scraped
	l.scrapedAt, l.scraped = now, true
	l.blind = !m.Has(podmetrics.PromptTokens) && !m.Has(podmetrics.Waiting|podmetrics.Running)
	if l.blind {
		for l.len() > 0 {
			c.confirm(e)
		}
	}
	// The engine is saturated when requests wait in it: it could not take
	// them yet.
	busyNow := m.Has(podmetrics.Waiting) && m.Waiting > 0
	l.share = 1
	if m.Has(podmetrics.Waiting) {
		ours := max(e.peakOurs, e.ours())
		if strangers := m.Waiting - ours; strangers > 0 {
			l.share = float64(ours) / float64(ours+strangers)
		}
	}
	if m.Has(podmetrics.PromptTokens) {
		if l.counterKnown {
			grew := m.PromptTokens - l.counter
			if grew < 0 {
				// The counter went back: the engine restarted, and the
				// requests it held are gone with it; it may not be the
				// engine it was, so the auto threshold starts over.
				for l.len() > 0 {
					c.confirm(e)
				}
				e.auto.Reset(e.maxBatched)
				grew = 0
				l.winAt, l.winCounter, l.winBusy = now, m.PromptTokens, busyNow
			}
			c.learnRate(l, m.PromptTokens, now, busyNow)
			done := uint64(min(grew*l.share, math.MaxUint64/2))
			paid := min(done, l.unobserved)
			l.unobserved -= paid
			done = done - paid + l.credit
			for l.len() > 0 && l.oldest().raw <= done {
				done -= l.oldest().raw
				c.confirm(e)
			}
			l.credit = 0
			if l.len() > 0 {
				l.credit = min(done, l.oldest().raw)
			}
			l.anchor = now
		} else {
			l.winAt, l.winCounter, l.winBusy = now, m.PromptTokens, busyNow
		}
		l.counterKnown, l.counter = true, m.PromptTokens
	}
	if m.Has(podmetrics.Waiting | podmetrics.Running) {
		held := max(0, m.Waiting+m.Running)
		if held == 0 {
			l.idleSeenAt = now
		}
		switch {
		case !m.Has(podmetrics.PromptTokens) && scrapedBefore:
			// Without a prompt-token counter (TRT-LLM serve) the request
			// counts bound the ledger: every awaiting request is still in
			// prefill, so among the engine's waiting or running requests.
			// Only grants sent before the previous delivery count: a later
			// one may not have reached the engine when it was scraped.
			for n := l.arrivedBefore(prevAt) - held; n > 0; n-- {
				c.confirm(e)
				l.credit = 0
			}
		case held > 0:
			l.idleSince = -1
		case l.idleSince < 0:
			l.idleSince = now
		case now-l.idleSince >= idleRelease:
			// A grant the engine has not shown at any scrape for
			// idleRelease, since it was sent or since the engine went
			// idle, never reached it (a client that left, a proxy that
			// failed).
			for l.len() > 0 && now-max(l.oldest().sentAt, l.idleSince) >= idleRelease {
				c.confirm(e)
				l.credit = 0
			}
			if l.len() == 0 {
				l.unobserved = 0 // it has counted all it will
			}
		}
	}
	return l.len() != before
}

// learnRate folds the counter into the prefill rate once the current
// window spans rateWindow, and starts the next window. A window in which
// the engine had requests waiting at every scrape measures its capacity,
// and moves the rate either way; any other window shows only that the
// engine is at least that fast, so it can raise the rate but not lower
// it. A raise takes the sample, up to twice the rate it updates (one
// burst cannot make prediction run far ahead of the engine, and the
// bounded lead stops it anyway), so the rate reaches the engine's within
// a few windows: a rate below it only slows prediction, and the picker
// then releases in bursts at the scrapes, which other replicas in front
// of the same engine see as strangers (TestTwoPickersOneEngine: with
// raises of a quarter the rate took the whole 10 s run to reach the
// engine's 33,000 tokens/s). A lower, from a saturated window, is
// smoothed.
func (c *Core) learnRate(l *ledger, counter float64, now int64, saturated bool) {
	l.winBusy = l.winBusy && saturated
	dt := now - l.winAt
	if dt < rateWindow {
		return
	}
	sample := (counter - l.winCounter) / (float64(dt) / 1e9)
	switch {
	case sample <= 0:
	case l.rate == 0:
		l.rate = sample
	case sample > l.rate:
		l.rate = min(sample, 2*l.rate)
	case l.winBusy:
		l.rate += rateEWMA * (sample - l.rate)
	}
	l.winAt, l.winCounter, l.winBusy = now, counter, saturated
}

// predict releases, at now, the awaiting grants the engine has had time
// to prefill at its learned rate since the last reconciliation, oldest
// first, and then the unseen requests (predictStrangers). It runs at
// every Drain.
func (c *Core) predict(now int64) {
	keep := c.awaitingEps[:0]
	for _, e := range c.awaitingEps {
		l := &e.led
		lead := uint64(float64(c.predictionLead(e)) * l.share)
		for l.len() > 0 && !e.removed {
			at, ok := l.nextPrefilled(lead)
			if !ok || at > now {
				break
			}
			g := l.oldest()
			l.unobserved += subSat(g.raw, l.credit)
			l.credit = 0
			l.anchor = at
			c.confirm(e)
		}
		if e.removed {
			for l.len() > 0 {
				c.confirm(e)
			}
		}
		if l.len() > 0 {
			keep = append(keep, e)
		}
	}
	clear(c.awaitingEps[len(keep):])
	c.awaitingEps = keep
	c.predictStrangers(now)
}

// predictStrangers removes, at now, the unseen requests the engine has had
// time to prefill since the scrape that counted them (or the last such
// prediction).
func (c *Core) predictStrangers(now int64) {
	keep := c.strangerEps[:0]
	for _, e := range c.strangerEps {
		if d, ok := c.strangerPrefill(e); ok {
			n := e.unseenWaiting
			for e.unseenWaiting > 0 && e.unseenAt+d <= now {
				e.unseenAt += d
				e.unseenWaiting--
			}
			if e.unseenWaiting != n {
				e.unseenPrefill = drr.SaturatingMul(uint64(e.unseenWaiting), c.meanPrompt)
				c.q.EndpointChanged(e.id)
			}
		}
		if e.unseenWaiting > 0 && !e.removed && !e.stale {
			keep = append(keep, e)
		} else {
			e.strangersListed = false
		}
	}
	clear(c.strangerEps[len(keep):])
	c.strangerEps = keep
}

// strangerPrefill is how long the engine takes, as predicted, to prefill
// one unseen request of e: the mean prompt at the learned rate times the
// strangers' part of the engine's queue. ok is false without a learned
// rate, and for a stale or removed endpoint: the unseen load then stays
// until the next fresh scrape.
func (c *Core) strangerPrefill(e *endpoint) (d int64, ok bool) {
	rate := e.led.rate * (1 - e.led.share)
	if rate <= 0 || e.unseenWaiting == 0 || e.removed || e.stale {
		return 0, false
	}
	return max(1, int64(math.Ceil(float64(c.meanPrompt)/rate*1e9))), true
}

// nextPrefilled is when the oldest awaiting grant's prefill is predicted
// to end: it starts once the engine is done with the ones before it (the
// anchor), not before it was sent, and not before the engine was last
// seen idle. ok is false while no rate is known, and while prediction is
// lead tokens or more ahead of the counter: then only the engine's own
// numbers release grants, so requests still on their way to the engine
// (which prediction cannot see) never add up to more than that.
func (l *ledger) nextPrefilled(lead uint64) (at int64, ok bool) {
	rate := l.rate * l.share
	if rate <= 0 || l.len() == 0 {
		return 0, false
	}
	g := l.oldest()
	need := subSat(g.raw, l.credit)
	if l.unobserved+need > lead {
		return 0, false
	}
	return max(l.anchor, g.sentAt, l.idleSeenAt) + int64(math.Ceil(float64(need)/rate*1e9)), true
}

// predictionLead is how far prediction may run ahead of e's counter, in
// prompt tokens: the most prefill the busy test lets any class keep at
// e. The engine then holds at most about twice what the busy test admits
// when every prediction is early.
func (c *Core) predictionLead(e *endpoint) uint64 {
	lead := uint64(0)
	for i := range c.pol.Busy {
		if c.pol.Busy[i].Auto {
			lead = max(lead, e.auto.Threshold())
			continue
		}
		lead = max(lead, c.pol.Busy[i].Limit(e.maxBatched))
	}
	return lead
}

// nextPrediction is the earliest predicted prefill end of any endpoint's
// oldest awaiting grant or oldest unseen request.
func (c *Core) nextPrediction() (at int64, ok bool) {
	for _, e := range c.awaitingEps {
		if t, tok := e.led.nextPrefilled(uint64(float64(c.predictionLead(e)) * e.led.share)); tok && (!ok || t < at) {
			at, ok = t, true
		}
	}
	for _, e := range c.strangerEps {
		if d, dok := c.strangerPrefill(e); dok && (!ok || e.unseenAt+d < at) {
			at, ok = e.unseenAt+d, true
		}
	}
	return at, ok
}

func subSat(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}
