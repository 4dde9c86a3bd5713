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
	// Engine is the picked endpoint's engine (for the priority polarity).
	Engine policy.Engine
	// Prefill is the prefill pod ("ip:port") of a disaggregated request,
	// for the x-prefiller-host-port header; "" when the pick serves the
	// whole request. PD is the disaggregation decision (the PD constants;
	// "" in a pool without prefill pods). See roles.go.
	Prefill string
	PD      string
	// LoRA is where the pick stood for the request's adapter (the LoRA
	// constants; "" for a base-model request). See lora.go.
	LoRA string

	rel             Releaser
	ep              *endpoint
	dec             *endpoint // the decode pod of a disaggregated grant (ep is its prefill pod)
	adapter         string    // the adapter counted on ep (and dec) until released
	pick            [1]string // Endpoints' storage when there are no fallbacks
	prefill         uint64    // owner-only from here on
	prefillReleased bool
	finished        bool
	firstByte       atomic.Bool
	done            atomic.Bool
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
// active prefill is the prompt tokens sent and not yet answered with a
// first byte). Each event counts once; EventDone implies EventFirstByte.
// The endpoint's lanes are rechecked at the next Drain.
func (c *Core) Release(g *Grant, ev Event) {
	c.prefillDone(g)
	if ev != EventDone || g.finished {
		return
	}
	g.finished = true
	e := g.ep
	if g.dec != nil {
		e = g.dec // the prefill pod let go at the first byte (handOver)
	}
	c.adapterDone(g, e)
	if e.inFlight > 0 {
		e.inFlight--
	}
	if e.decoding > 0 {
		e.decoding--
	}
}

func (c *Core) prefillDone(g *Grant) {
	if g.prefillReleased {
		return
	}
	g.prefillReleased = true
	e := g.ep
	if e.activePrefill >= g.prefill {
		e.activePrefill -= g.prefill
	} else {
		e.activePrefill = 0
	}
	if g.dec != nil {
		c.handOver(g)
	} else {
		e.decoding++ // past prefill the request decodes
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
	g := &Grant{rel: c.opts.Releaser, ep: e, Engine: e.engine, prefill: t.Uncached()}
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
	e.peakInFlight = max(e.peakInFlight, e.inFlight)
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
	var wait time.Duration
	if queued {
		wait = time.Duration(now - r.arrival)
	}
	r.grant = g
	c.leave(r, Leave{Grant: g, Queued: queued, Wait: wait})
}
