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

	rel             Releaser
	ep              *endpoint
	pick            [1]string // Endpoints' storage when there are no fallbacks
	prefill         uint64    // owner-only from here on
	prefillReleased bool
	finished        bool
	firstByte       atomic.Bool
	done            atomic.Bool
}

// RemoteGrant is a grant another replica's core made (the leader's, over
// the replica link): the pick and its fallbacks, and the picked
// endpoint's engine. Its events go to rel, which carries them back to
// that core; it must never be given to this replica's Core.Release,
// which accounts only for its own grants.
func RemoteGrant(endpoints []string, engine policy.Engine, rel Releaser) *Grant {
	return &Grant{Endpoints: endpoints, Engine: engine, rel: rel}
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
	if g.ep == nil {
		return // a RemoteGrant: not this core's to account
	}
	c.prefillDone(g)
	if ev != EventDone || g.finished {
		return
	}
	g.finished = true
	e := g.ep
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
	e.decoding++ // past prefill the request decodes
	if !e.removed {
		c.q.EndpointChanged(e.id)
	}
}

// grant picks the endpoint(s) for r, charges the pick and records the
// decision (SPEC §5 pick and charge).
func (c *Core) grant(now int64, r *Request, queued bool) {
	t := r.Ticket
	c.cands = c.cands[:0]
	reuse := c.overlapFor == r && c.overlapGen == c.indexGen
	hashes := c.cacheableBlocks(t)
	for i, n := 0, c.numCandidates(r); i < n; i++ {
		e := c.candidateAt(r, i)
		if !c.eligible(e, r) {
			continue
		}
		var cached uint64
		if len(hashes) > 0 {
			blocks := 0
			if reuse {
				blocks = c.overlap[e.id]
			} else {
				blocks = c.index.Overlap(int(e.id), hashes, now)
			}
			cached = cachedTokens(blocks, t)
		}
		c.cands = append(c.cands, Candidate{
			ID:            e.id,
			Addr:          e.addr,
			ActivePrefill: e.activePrefill,
			InFlight:      e.inFlight,
			Busy:          c.busy(e, t.Class),
			Stale:         e.stale,
			CachedTokens:  cached,
			UnseenPrefill: e.unseenPrefill,
			Decoding:      max(e.decoding, e.running),
		})
	}
	c.overlapFor = nil
	if len(c.cands) == 0 {
		c.reject(r, c.noEndpoint(r), ReasonNoEndpoints)
		return
	}
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
	if c.index != nil && len(t.Blocks) > 0 && t.BlockSize > 0 {
		c.index.Record(int(e.id), t.Blocks, t.BlockSize, now)
		c.indexGen++
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
