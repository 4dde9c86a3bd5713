package sched

import (
	"sync/atomic"
	"time"

	"github.com/laneway-dev/laneway/pkg/drr"
	"github.com/laneway-dev/laneway/pkg/policy"
)

// Event is a response-path event of a grant.
type Event uint8

const (
	// EventFirstByte: the endpoint sent the first response byte, so it
	// finished this request's prefill.
	EventFirstByte Event = iota
	// EventDone: the request's stream ended.
	EventDone
)

// Releaser takes a grant's response-path events from the goroutine of the
// stream (it must not block) to the Core's owner, which applies them with
// Release.
type Releaser interface {
	Release(g *Grant, ev Event)
}

// Grant is an endpoint given to a request. Its response-path events release
// the endpoint's accounting; it implements extproc's Lifecycle.
type Grant struct {
	// Endpoints is the pick followed by ordered fallbacks ("ip:port").
	Endpoints []string

	rel  Releaser
	ep   *endpoint // the pick, charged; a disaggregated grant's prefill pod
	pick [1]string // Endpoints' storage when there are no fallbacks

	// Owner-only from here on: the charge (uncached tokens), the prompt
	// as the engine counts it (raw tokens) and when it was sent.
	prefill, raw uint64
	sentAt       int64
	// x is what a disaggregated or adapter grant needs besides; nil for
	// every other grant, so a pool without roles or adapters pays one
	// pointer for them.
	x *grantExtra

	// Engine is the picked endpoint's engine (for the priority polarity).
	Engine policy.Engine
	// PD is the disaggregation decision (PDNone in a pool without prefill
	// pods); see roles.go.
	PD PDDecision
	// LoRA is where the pick stood for the request's adapter (LoRANone
	// for a base-model request); see lora.go.
	LoRA LoRAOutcome

	prefillReleased bool
	finished        bool

	firstByte atomic.Bool
	done      atomic.Bool
}

// grantExtra is the part of a grant that only disaggregated and adapter
// requests use.
type grantExtra struct {
	prefiller string    // the prefill pod's address (disaggregated)
	dec       *endpoint // the decode pod (disaggregated)
	adapter   string    // the adapter counted on ep (and dec) until released
}

// Prefiller is the prefill pod ("ip:port") of a disaggregated request, for
// the x-prefiller-host-port header; "" when the pick serves the whole
// request.
func (g *Grant) Prefiller() string {
	if g.x == nil {
		return ""
	}
	return g.x.prefiller
}

// NewGrant returns a grant no core accounts for (its events are
// dropped): to endpoints, and disaggregated with its prefill on prefiller
// when that is not "". For Acquirers that do not schedule, such as tests'.
func NewGrant(endpoints []string, prefiller string) *Grant {
	g := &Grant{Endpoints: endpoints}
	if prefiller != "" {
		g.x = &grantExtra{prefiller: prefiller}
	}
	return g
}

// extra returns g's extra part, allocating it on first use.
func (g *Grant) extra() *grantExtra {
	if g.x == nil {
		g.x = new(grantExtra)
	}
	return g.x
}

// dec is the decode pod of a disaggregated grant, else nil.
func (g *Grant) dec() *endpoint {
	if g.x == nil {
		return nil
	}
	return g.x.dec
}

// RemoteGrant is a grant another replica's core made (the leader's, over
// the replica link): the pick and its fallbacks, the prefill pod of a
// disaggregated grant ("" for none), and the picked endpoint's engine.
// Its events go to rel, which carries them back to that core; it must
// never be given to this replica's Core.Release, which accounts only for
// its own grants.
func RemoteGrant(endpoints []string, prefiller string, engine policy.Engine, rel Releaser) *Grant {
	g := NewGrant(endpoints, prefiller)
	g.Engine, g.rel = engine, rel
	return g
}

// FirstByte reports the first response byte: the endpoint finished this
// request's prefill. Safe for concurrent use; only the first call counts.
func (g *Grant) FirstByte() {
	if g.firstByte.CompareAndSwap(false, true) && !g.done.Load() && g.rel != nil {
		g.rel.Release(g, EventFirstByte)
	}
}

// Done reports the end of the request's stream. Safe for concurrent use;
// only the first call counts.
func (g *Grant) Done() {
	if g.done.CompareAndSwap(false, true) && g.rel != nil {
		g.rel.Release(g, EventDone)
	}
}

// Release applies a grant's event to the endpoint accounting (SPEC §5:
// active prefill is the prompt tokens sent and not yet known to have left
// prefill). Each event counts once; EventDone implies EventFirstByte when
// the first byte was reported, and otherwise hands the grant's charge to
// the endpoint's engine ledger, which keeps it until the engine's own
// counters say the prompt left prefill (see ledger.go). The endpoint's
// lanes are rechecked at the next Drain.
//
// A disaggregated grant is charged to its prefill pod (ep), whose ledger
// takes the charge when the stream ends first; the prefill pod holds the
// request in flight until the first byte or the end, and the decode pod
// (dec) to the end.
func (c *Core) Release(g *Grant, ev Event) {
	if g.ep == nil {
		return // a RemoteGrant: not this core's to account
	}
	if g.finished {
		return
	}
	e := g.ep
	if ev == EventFirstByte || g.prefillReleased {
		if !g.prefillReleased {
			c.prefillDone(g)
			c.startDecode(g)
		}
		if ev != EventDone {
			return
		}
		if d := g.decodePod(); d.decoding > 0 {
			d.decoding--
		}
	} else {
		// The stream ended with no first byte reported: a gateway that
		// sends no response phases, or a request that ended early. Its
		// prompt may still be in the (prefill pod's) engine.
		c.await(e, g)
		if g.dec() != nil {
			c.leavePrefill(g)
		}
	}
	c.finish(g)
}

// releaseUnsent undoes a grant its caller never received: the request
// never reached the endpoint, so nothing waits for the engine.
func (c *Core) releaseUnsent(g *Grant) {
	if g.finished {
		return
	}
	if !g.prefillReleased {
		c.prefillDone(g)
		if g.dec() != nil {
			c.leavePrefill(g)
		}
	} else if d := g.decodePod(); d.decoding > 0 {
		d.decoding--
	}
	c.finish(g)
}

// finish ends g on the endpoint that held it to its end.
func (c *Core) finish(g *Grant) {
	g.finished = true
	d := g.decodePod()
	c.adapterDone(g, d)
	if d.inFlight > 0 {
		d.inFlight--
	}
}

// decodePod is the endpoint that decodes g: its decode pod when
// disaggregated, else its pick.
func (g *Grant) decodePod() *endpoint {
	if d := g.dec(); d != nil {
		return d
	}
	return g.ep
}

// startDecode is g's first byte, after its charge returned: past prefill
// the request decodes (on the decode pod of a disaggregated grant, which
// the prefill pod hands it over to).
func (c *Core) startDecode(g *Grant) {
	if g.dec() != nil {
		c.handOver(g)
		return
	}
	g.ep.decoding++
}

// prefillDone returns the grant's prefill charge.
func (c *Core) prefillDone(g *Grant) {
	g.prefillReleased = true
	e := g.ep
	if e.activePrefill >= g.prefill {
		e.activePrefill -= g.prefill
	} else {
		e.activePrefill = 0
	}
	if !e.removed {
		c.q.EndpointChanged(e.id)
	}
}

// grant picks the endpoint(s) for r from its judged candidate set s,
// charges the pick and records the decision (SPEC §5 pick and charge).
func (c *Core) grant(now int64, r *Request, queued bool, s *candidateSet) {
	t := r.Ticket
	if len(s.eps) == 0 || s.stageMissing() != "" {
		c.reject(r, c.noEndpoint(r, s), ReasonNoEndpoints)
		return
	}
	c.cands = c.cands[:0]
	for _, x := range s.eps {
		e := c.reg.eps[x.id]
		c.cands = append(c.cands, Candidate{
			ID:            e.id,
			Addr:          e.addr,
			ActivePrefill: e.activePrefill,
			InFlight:      e.inFlight,
			Busy:          x.busy,
			Stale:         e.stale,
			CachedTokens:  x.cached,
			UnseenPrefill: e.unseenPrefill,
			Decoding:      max(e.decoding, e.running),
		})
	}
	c.setLoRATiers(t, c.cands)
	c.order = c.opts.Chooser.Choose(t, c.cands, c.order[:0])
	n := min(1+c.opts.MaxFallbacks, len(c.order))
	e := c.reg.eps[c.cands[c.order[0]].ID]
	g := &Grant{rel: c.opts.Releaser, ep: e, Engine: e.engine, prefill: t.Uncached(), raw: t.RawISL, sentAt: now}
	if n == 1 {
		g.pick[0] = e.addr
		g.Endpoints = g.pick[:1:1] // no fallbacks (the default): no second allocation
	} else {
		g.Endpoints = make([]string, n)
		for i := range n {
			g.Endpoints[i] = c.cands[c.order[i]].Addr
		}
	}
	e.activePrefill = drr.SaturatingAdd(e.activePrefill, g.prefill)
	e.inFlight++
	e.sent++
	e.peakOurs = max(e.peakOurs, e.ours())
	c.q.EndpointChanged(e.id)
	if s.split {
		c.decodeStage(g, r, s) // disaggregated: the pick above is the prefill pod
	}
	c.noteAdapter(g, t)
	if c.index != nil && len(t.Blocks) > 0 && t.BlockSize > 0 {
		c.index.Record(int(e.id), t.Blocks, t.BlockSize, now)
	}
	// The unseen-load estimate: a moving mean (1/16) of what we dispatch.
	c.meanPrompt = c.meanPrompt - c.meanPrompt/16 + g.prefill/16
	// The expected output, for the auto threshold's cache prediction: a
	// moving mean (1/16) of what the requests that said asked for.
	if o := min(r.Ticket.OutputTokens, maxOutputTokens); o > 0 {
		if c.meanOutput == 0 {
			c.meanOutput = o
		}
		c.meanOutput = c.meanOutput - c.meanOutput/16 + o/16
	}
	var wait time.Duration
	if queued {
		wait = time.Duration(now - r.arrival)
	}
	r.grant = g
	c.leave(r, Leave{Grant: g, Queued: queued, Wait: wait})
}
