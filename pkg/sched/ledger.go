package sched

import (
	"math"

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
//     oldest grants while it covers their prompts;
//   - the engine's request counts: the ledger never holds more grants
//     than the engine has waiting and running requests;
//   - prediction between scrapes: with the prefill rate learned from the
//     counter, the oldest grant is released once the engine had time to
//     prefill it after the ones before it (a grant cannot start before it
//     was sent). A prediction that runs ahead of the engine leaves its
//     request in the engine's waiting queue, where the unseen-load
//     estimate counts it at the next scrape.
//
// The ledger is owned by the core's goroutine, like the rest of the
// endpoint; its cost is O(1) amortised per grant (each enters and leaves
// the queue once) plus O(E) per Drain for the endpoints holding grants.

// ledger is one endpoint's reconciliation state.
type ledger struct {
	// awaiting is the FIFO of grants whose stream ended before their first
	// byte; the queue is awaiting[head:].
	awaiting []*Grant
	head     int

	// The engine's prompt-token counter at the last fresh scrape that had
	// it, and when that scrape was applied.
	counterKnown bool
	counter      float64
	counterAt    int64
	// Since that scrape: raw prompt tokens of grants confirmed by a first
	// byte (the engine counted them too), and released by prediction.
	confirmed, predicted uint64
	// credit is prefilled tokens attributed to the oldest awaiting grant
	// but not yet enough to cover its prompt.
	credit uint64
	// rate is the learned prefill rate in prompt tokens per second, as the
	// counter counts them (0: not learned yet); busyAtScrape says the
	// engine had prefill work queued at the last scrape.
	rate         float64
	busyAtScrape bool
	// anchor is when the oldest awaiting grant's prefill is assumed to
	// have started: the last reconciliation or the last prediction.
	anchor int64
	// blind: the last fresh scrape had nothing to reconcile against
	// (no request counts and no prompt-token counter).
	blind bool
}

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
// saturated scrape intervals count.
const rateEWMA = 0.25

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
	l.blind = !m.Has(podmetrics.PromptTokens) && !m.Has(podmetrics.Waiting|podmetrics.Running)
	if l.blind {
		for l.len() > 0 {
			c.confirm(e)
		}
	}
	busyNow := e.pending > 0 || (m.Has(podmetrics.Waiting) && m.Waiting > 0)
	if m.Has(podmetrics.PromptTokens) {
		if l.counterKnown {
			grew := m.PromptTokens - l.counter
			if grew < 0 {
				// The counter went back: the engine restarted, and the
				// requests it held are gone with it.
				for l.len() > 0 {
					c.confirm(e)
				}
				grew = 0
			}
			c.learnRate(l, grew, now, busyNow)
			done := uint64(min(grew, math.MaxUint64/2))
			done = subSat(subSat(done, l.confirmed), l.predicted) + l.credit
			for l.len() > 0 && l.oldest().raw <= done {
				done -= l.oldest().raw
				c.confirm(e)
			}
			l.credit = 0
			if l.len() > 0 {
				l.credit = min(done, l.oldest().raw)
			}
			l.anchor = now
		}
		l.counterKnown, l.counter, l.counterAt = true, m.PromptTokens, now
		l.confirmed, l.predicted = 0, 0
	}
	if m.Has(podmetrics.Waiting | podmetrics.Running) {
		// Every awaiting request is still in prefill, so in the engine's
		// waiting or running requests: never more of them than those.
		for l.len() > max(0, m.Waiting+m.Running) {
			c.confirm(e)
			l.credit = 0
		}
	}
	l.busyAtScrape = busyNow
	return l.len() != before
}

// learnRate folds one scrape interval's counter growth into the prefill
// rate. An interval with prefill work queued at both of its ends measures
// the engine's capacity; any other only shows it is at least that fast.
func (c *Core) learnRate(l *ledger, grew float64, now int64, busyNow bool) {
	dt := float64(now-l.counterAt) / 1e9
	if dt <= 0 || grew <= 0 {
		return
	}
	sample := grew / dt
	switch {
	case l.busyAtScrape && busyNow && l.rate > 0:
		l.rate += rateEWMA * (sample - l.rate)
	case l.busyAtScrape && busyNow, sample > l.rate:
		l.rate = sample
	}
}

// predict releases, at now, the awaiting grants the engine has had time
// to prefill at its learned rate since the last reconciliation, oldest
// first, and reports whether any was released. It runs at every Drain.
func (c *Core) predict(now int64) bool {
	released := false
	keep := c.awaitingEps[:0]
	for _, e := range c.awaitingEps {
		l := &e.led
		for l.len() > 0 && !e.removed {
			at, ok := l.nextPrefilled()
			if !ok || at > now {
				break
			}
			g := l.oldest()
			l.predicted += subSat(g.raw, l.credit)
			l.credit = 0
			l.anchor = at
			c.confirm(e)
			released = true
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
	return released
}

// nextPrefilled is when the oldest awaiting grant's prefill is predicted
// to end: it starts once the engine is done with the ones before it (the
// anchor) and not before it was sent; ok is false while no rate is known.
func (l *ledger) nextPrefilled() (at int64, ok bool) {
	if l.rate <= 0 || l.len() == 0 {
		return 0, false
	}
	g := l.oldest()
	need := float64(subSat(g.raw, l.credit))
	return max(l.anchor, g.sentAt) + int64(math.Ceil(need/l.rate*1e9)), true
}

// nextPrediction is the earliest predicted prefill end of any endpoint's
// oldest awaiting grant.
func (c *Core) nextPrediction() (at int64, ok bool) {
	for _, e := range c.awaitingEps {
		if t, tok := e.led.nextPrefilled(); tok && (!ok || t < at) {
			at, ok = t, true
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
