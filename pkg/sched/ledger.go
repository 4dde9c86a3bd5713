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
// streams ended, and keeps its charge until the engine's own numbers say
// its prompt left prefill, always the oldest first.
//
// Engines prefill first come, first served, and their prompt-token
// counter (vLLM's and SGLang's prompt_tokens_total) grows by a request's
// whole prompt at the step that finishes its prefill. So every request
// sent to an endpoint has a place in the engine's line, in the counter's
// units: the counter's value once the engine has prefilled everything
// ahead of it and then it. At each fresh scrape the line's end (tail) is
// the counter plus what the engine still holds: its waiting requests and
// its running ones' prefill (at most one step's budget), each counted as
// the mean prompt we send. A grant sent later is placed at the tail plus
// its prompt, and moves the tail on by it. The picker cannot see other
// replicas' requests, but it sees the line they make: they stand in the
// engine's queue at the next scrape and the tail moves past them, and
// they grow the counter only as fast as the engine works, so the counter
// reaches a grant's place no sooner than the engine reached the grant.
// Strangers that arrive between a scrape and one of our grants stand
// ahead of it unseen: a grant is released at most one scrape interval's
// worth of their prompts early, and the next scrape's tail has them.
//
// A grant is released when:
//
//   - a fresh scrape's counter has reached its place;
//   - prediction, between scrapes, has: with the prefill rate learned
//     from the counter, the counter is taken to grow at that rate from
//     the scrape on (the engine is busy while it holds the grant or
//     anything ahead of it), and the grant is done once it reaches the
//     place, but not before the grant was sent and prefilled, and only
//     while the place is at most the busy limit past the line the scrape
//     saw, so requests still on their way to the engine (which
//     prediction cannot see) never add up to more than that; the line
//     keeps the grants prediction released until the counter passes
//     them, and a grant the engine was seen idle after (it had not
//     arrived: a slow proxy, a held request) is never predicted;
//   - the engine, seen holding no request at all, has counted past the
//     grant's own place, where it stands behind our grants alone (its
//     place was an overestimate: the requests ahead were shorter than
//     the mean);
//   - the engine has shown no request at any scrape for idleRelease since
//     the grant was sent (it never arrived);
//   - the counter went back (a restarted engine holds none of them).
//
// Without a prompt-token counter (TRT-LLM serve) the engine's request
// counts bound the ledger instead: it never holds more grants than the
// engine has waiting and running requests.
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
	// tail is the end of the engine's line in the counter's units (the
	// counter's value once everything it holds and we sent since is
	// prefilled); seen is how far past the counter the last fresh scrape
	// saw the line end (the engine's own queue, without our grants since);
	// own is the end of the line of our own grants alone; tailAt is when
	// the tail was last moved.
	tail, seen, own float64
	tailAt          int64
	// predictedTo is the furthest place prediction released a grant at:
	// the line reaches at least that far until the counter has.
	predictedTo float64
	// strangerRate is the learned rate, in prompt tokens per second, at
	// which requests we did not send join the engine's line (other
	// replicas, clients that bypass the picker; learnStrangers). sent is
	// the prompt tokens we sent (cumulative), sentAtScrape its value at
	// the last fresh scrape.
	// joined and joinedSecs are the moving means of the tokens that
	// joined from elsewhere between two scrapes and of the scrapes'
	// interval.
	strangerRate       float64
	sent, sentAtScrape float64
	joined, joinedSecs float64
	// rate is the learned prefill rate in prompt tokens per second, as the
	// counter counts them (0: not learned yet). It is measured over
	// windows of at least rateWindow starting at winAt with the counter
	// at winCounter; winBusy says the engine had requests waiting at
	// every scrape of the window so far.
	rate float64
	// share is the part of the engine's waiting queue that may be ours,
	// in (0, 1]: 1 while it holds no more requests than we may have
	// there, else ours / (ours + strangers) at the last fresh scrape. The
	// strangers leave prefill between scrapes at the rest of the rate
	// (predictStrangers).
	share      float64
	winAt      int64
	winCounter float64
	winBusy    bool
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

// push adds g to the queue in the order of the places: streams end in
// about the order their grants were sent, but not exactly (four sent
// together end in any order), and a grant's release must not wait for
// one placed behind it. Insertion from the back: O(the grants g
// overtakes).
func (l *ledger) push(g *Grant) {
	l.awaiting = append(l.awaiting, g)
	i := len(l.awaiting) - 1
	for ; i > l.head && g.placed && l.awaiting[i-1].placed && l.awaiting[i-1].place > g.place; i-- {
		l.awaiting[i] = l.awaiting[i-1]
	}
	l.awaiting[i] = g
}

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
	if !g.placed {
		e.led.place(g, g.sentAt) // sent before the counter was known
	}
	if e.led.len() == 0 {
		c.awaitingEps = append(c.awaitingEps, e)
	}
	e.led.push(g)
}

// place gives g, sent to the endpoint, its place in the engine's line
// (if the counter is known): the tail plus its prompt. Its own place is
// where it would stand behind only our own grants: the engine cannot
// have prefilled it before the counter got there.
func (l *ledger) place(g *Grant, now int64) {
	if !l.counterKnown {
		return
	}
	l.join(float64(g.raw), now)
	g.place, g.ownPlace, g.placed = l.tail, l.own, true

}

// join moves the engine's line on, at now, by a prompt of raw tokens that
// joins it (one of ours, or a prompt the engine will count although it
// does not prefill it: a disaggregated request's transferred KV cache, on
// its decode pod), after the strangers that joined since the line was
// last moved, at their learned rate.
func (l *ledger) join(raw float64, now int64) {
	l.sent += raw
	if !l.counterKnown {
		return
	}
	if now > l.tailAt {
		l.tail += max(l.strangerRate, 0) * float64(now-l.tailAt) / 1e9
		l.tailAt = now
	}
	l.tail = max(l.tail, l.counter) + raw
	l.own = max(l.own, l.counter) + raw
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
		// The line ends past the counter by what the engine holds: its
		// waiting requests, and what its running ones have left to
		// prefill (at most a step's budget: the rest of them decode).
		seen := 0.0
		if m.Has(podmetrics.Waiting) {
			seen = float64(max(m.Waiting, 0)) * float64(c.meanRaw)
		}
		if m.Has(podmetrics.Running) {
			running := float64(max(m.Running, 0)) * float64(c.meanRaw)
			if e.maxBatched > 0 {
				running = min(running, float64(e.maxBatched))
			}
			seen += running
		}
		if l.counterKnown {
			if m.PromptTokens < l.counter {
				// The counter went back: the engine restarted, and the
				// requests it held are gone with it; it may not be the
				// engine it was, so the auto threshold starts over.
				for l.len() > 0 {
					c.confirm(e)
				}
				e.auto.Reset(e.maxBatched)
				l.startWindow(now, m.PromptTokens, busyNow)
				l.tail, l.own, l.strangerRate, l.joined, l.joinedSecs, l.predictedTo = 0, 0, 0, 0, 0, 0
			}
			c.learnRate(l, m.PromptTokens, now, busyNow)
			l.learnStrangers(m.PromptTokens, seen, now, prevAt)
		} else {
			l.startWindow(now, m.PromptTokens, busyNow)
		}
		l.counterKnown, l.counter, l.seen, l.sentAtScrape = true, m.PromptTokens, seen, l.sent
		// Grants released by prediction that the counter has not
		// reached are in the line, whether the engine shows them yet or
		// they are still on their way to it.
		l.tail, l.tailAt = max(l.counter+l.seen, l.predictedTo), now
		for i := l.head; i < len(l.awaiting); i++ {
			if g := l.awaiting[i]; !g.placed {
				l.place(g, now) // sent before the counter was known
			}
		}
		for l.len() > 0 && l.oldest().place <= l.counter {
			c.confirm(e)
		}
	}
	if m.Has(podmetrics.Waiting | podmetrics.Running) {
		held := max(0, m.Waiting+m.Running)
		if held == 0 {
			l.idleSeenAt = now
		}
		if held == 0 && l.counterKnown && scrapedBefore {
			// An engine that holds nothing has prefilled every grant that
			// reached it: those sent before the previous delivery whose
			// own place the counter passed (their place was too far: the
			// requests ahead were shorter than the mean).
			for l.len() > 0 && l.oldest().sentAt < prevAt && l.oldest().ownPlace <= l.counter {
				c.confirm(e)
			}
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
	secs := float64(dt) / 1e9
	sample := (counter - l.winCounter) / secs
	switch {
	case sample <= 0:
	case l.rate == 0:
		l.rate = sample
	case sample > l.rate:
		l.rate = min(sample, 2*l.rate)
	case l.winBusy:
		l.rate += rateEWMA * (sample - l.rate)
	}
	l.startWindow(now, counter, saturated)
}

// startWindow starts a rate window at now.
func (l *ledger) startWindow(now int64, counter float64, saturated bool) {
	l.winAt, l.winCounter, l.winBusy = now, counter, saturated
}

// learnStrangers folds one scrape into the strangers' rate: since the
// previous scrape the line grew by the counter's growth plus the growth of
// what the engine holds, and we sent part of that; the rest joined from
// elsewhere. A scrape that lands while our prompts are on their way to
// the engine shows less than that, the next one more: the rate is the
// moving mean of the tokens over the moving mean of the intervals, so a
// short interval that has our prompts not yet counted and a long one that
// counts them cancel out. It is at least 0.
func (l *ledger) learnStrangers(counter, seen float64, now, prevAt int64) {
	if now <= prevAt {
		return
	}
	joined := (counter - l.counter) + (seen - l.seen) - (l.sent - l.sentAtScrape)
	secs := float64(now-prevAt) / 1e9
	if l.joinedSecs == 0 {
		l.joined, l.joinedSecs = joined, secs
	} else {
		l.joined += strangerEWMA * (joined - l.joined)
		l.joinedSecs += strangerEWMA * (secs - l.joinedSecs)
	}
	l.strangerRate = max(0, l.joined/l.joinedSecs)
}

// strangerEWMA weighs a scrape's sample of the strangers' rate: about the
// last three scrapes count, so the rate follows another replica's load
// within a few tenths of a second, and one scrape's burst, or a request
// the mean prompt miscounts, moves the line little.
const strangerEWMA = 0.3

// predict releases, at now, the awaiting grants the engine has had time
// to prefill at its learned rate since the last reconciliation, oldest
// first, and then the unseen requests (predictStrangers). It runs at
// every Drain.
func (c *Core) predict(now int64) {
	keep := c.awaitingEps[:0]
	for _, e := range c.awaitingEps {
		l := &e.led
		lead := c.predictionLead(e)
		for l.len() > 0 && !e.removed {
			at, ok := l.nextPrefilled(lead)
			if !ok || at > now {
				break
			}
			l.predictedTo = max(l.predictedTo, l.oldest().place)
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
// to end: when the counter, growing at the learned rate from the last
// scrape (or from when the engine was last seen idle), reaches its place,
// and not before it was sent and then prefilled. ok is false while no
// rate or counter is known, and for a grant placed more than lead tokens
// past the line the last scrape saw: then only the engine's own numbers
// release it, so requests still on their way to the engine (which
// prediction cannot see) never add up to more than that.
func (l *ledger) nextPrefilled(lead uint64) (at int64, ok bool) {
	if l.rate <= 0 || l.len() == 0 || !l.counterKnown {
		return 0, false
	}
	g := l.oldest()
	if !g.placed || g.sentAt < l.idleSeenAt {
		// An engine seen holding nothing after the grant was sent had
		// not received it then (a slow proxy, a held request): when its
		// prefill starts is anyone's guess, so only the engine's own
		// numbers release it.
		return 0, false
	}
	ahead := max(g.place-l.counter, 0)
	if ahead > l.seen+float64(lead) {
		return 0, false
	}
	at = max(l.scrapedAt, l.idleSeenAt) + int64(math.Ceil(ahead/l.rate*1e9))
	return max(at, g.sentAt+int64(math.Ceil(float64(g.raw)/l.rate*1e9))), true
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
		if t, tok := e.led.nextPrefilled(c.predictionLead(e)); tok && (!ok || t < at) {
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
