package dispatcher

import (
	"github.com/laneway-dev/laneway/pkg/drr"
	"github.com/laneway-dev/laneway/pkg/podmetrics"
)

// This file holds the endpoint intelligence the loop keeps besides its own
// accounting: the prefix index's cost snapshot and scraped metrics.

// cacheableBlocks is the part of the ticket's block hashes an engine can
// serve from cache: never the block holding the last prompt token, which
// the engine always computes to produce logits (vLLM and the simulator
// both stop there). Empty when the index is off or the ticket has none.
func (d *Dispatcher) cacheableBlocks(t *Ticket) []uint64 {
	if d.index == nil || len(t.Blocks) == 0 || t.BlockSize <= 0 || t.RawISL == 0 {
		return nil
	}
	n := min(uint64(len(t.Blocks)), (t.RawISL-1)/uint64(t.BlockSize))
	return t.Blocks[:n]
}

// snapshotCached sets the ticket's Cached to the best prefix overlap over
// its eligible endpoints (the pinned one for a pinned request), SPEC §1,
// and keeps the per-endpoint overlaps for a grant in the same loop turn.
// It reports whether Cached is non-zero (the class must be resolved again).
func (d *Dispatcher) snapshotCached(w *waiter) bool {
	t := w.t
	hashes := d.cacheableBlocks(t)
	if len(hashes) == 0 {
		return false
	}
	if len(d.overlap) < len(d.eps) {
		d.overlap = make([]int, len(d.eps))
	}
	now := d.now()
	best := 0
	for _, id := range d.candidates(w) {
		e := d.endpointByID(id)
		if !d.eligible(e, w) {
			continue
		}
		n := d.index.Overlap(int(id), hashes, now)
		d.overlap[id] = n
		best = max(best, n)
	}
	d.overlapFor, d.overlapGen = w, d.indexGen
	t.Cached = min(uint64(best)*uint64(t.BlockSize), t.RawISL)
	return t.Cached > 0
}

// setMetrics applies one scrape delivery and reports whether the
// endpoint's busy inputs changed (its lanes were marked for a recheck).
//
// The busy test's view of load this picker cannot see: the engine's queue
// holds at most peakInFlight of our requests (the most we had in flight
// there since the previous delivery, so requests that finished between the
// scrape and its delivery are not mistaken for strangers), and every
// waiting request beyond that came from elsewhere. Each such request counts
// as the moving mean of the prompts we dispatch in prefill tokens. Running
// requests count only in the cost picker's decode load.
func (d *Dispatcher) setMetrics(u *metricsUpdate) bool {
	id, ok := d.byAddr[u.addr]
	if !ok {
		return false
	}
	e := d.eps[id]
	changed := e.stale != u.stale
	e.stale = u.stale
	if !u.stale {
		m := &u.m
		ours := max(e.peakInFlight, e.inFlight)
		e.peakInFlight = e.inFlight
		unseen := 0
		if m.Has(podmetrics.Waiting) {
			unseen = max(0, m.Waiting-ours)
			wasOver := d.overloaded(e)
			e.waiting = m.Waiting
			if d.overloaded(e) != wasOver {
				changed = true
			}
		}
		prefill := drr.SaturatingMul(uint64(unseen), d.meanPrompt)
		if prefill != e.unseenPrefill {
			changed = true
		}
		e.unseenWaiting, e.unseenPrefill = unseen, prefill
		e.running = m.Running
		if d.index != nil && m.Has(podmetrics.NumBlocks|podmetrics.BlockSize) {
			d.index.SetCapacity(int(id), drr.SaturatingMul(uint64(m.NumBlocks), uint64(m.BlockSize)))
		}
		bs := 0
		if m.Has(podmetrics.BlockSize) {
			bs = m.BlockSize
		}
		if bs != e.engineBS {
			e.engineBS = bs
			d.updateHashBlockSize()
		}
	}
	if changed {
		d.sched.EndpointChanged(id)
	}
	return changed
}

// updateHashBlockSize sets the hashing block size to the configured one or
// the largest block size a live endpoint reports, whichever is larger: a
// coarser hash than the engine's only rounds the overlap down, and an
// engine with token-sized pages (SGLang's default) must not make the
// parser hash every token.
func (d *Dispatcher) updateHashBlockSize() {
	bs := d.baseBS
	for _, id := range d.live {
		bs = max(bs, d.eps[id].engineBS)
	}
	d.hashBS.Store(int64(bs))
}
