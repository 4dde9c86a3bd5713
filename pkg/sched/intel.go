package sched

import (
	"github.com/laneway-dev/laneway/pkg/autothreshold"
	"github.com/laneway-dev/laneway/pkg/drr"
	"github.com/laneway-dev/laneway/pkg/podmetrics"
)

// This file holds the endpoint intelligence besides the core's own
// accounting: the prefix index's side of the cost snapshot (which blocks
// count, blocks to tokens; the walk that takes it is candidates) and
// scraped metrics.

// cacheableBlocks is the part of the ticket's block hashes an engine can
// serve from cache: never the block holding the last prompt token, which
// the engine always computes to produce logits (vLLM and the simulator
// both stop there). Empty when the index is off or the ticket has none.
func (c *Core) cacheableBlocks(t *Ticket) []uint64 {
	if c.index == nil {
		return nil
	}
	return t.Blocks[:CacheableBlocks(t.RawISL, len(t.Blocks), t.BlockSize)]
}

// CacheableBlocks is how many of a prompt's blocks hashes (blocks of
// them, at blockSize tokens each, for a prompt of rawISL tokens) the
// prefix index is asked about at admission: never the block holding the
// last prompt token. The replica link (pkg/replica) sends only the hashes
// the index reads, and needs this bound to know them.
func CacheableBlocks(rawISL uint64, blocks, blockSize int) int {
	if blocks <= 0 || blockSize <= 0 || rawISL == 0 {
		return 0
	}
	return int(min(uint64(blocks), (rawISL-1)/uint64(blockSize)))
}

// cachedTokens turns an overlap in blocks into the cached tokens of SPEC
// §1, clamped to the prompt.
func cachedTokens(blocks int, t *Ticket) uint64 {
	return min(uint64(blocks)*uint64(t.BlockSize), t.RawISL)
}

// SetMetrics applies one scrape of the endpoint at addr, delivered at now
// (fresh metrics, or stale true: busy and ranked last until fresh ones
// come) and reports whether the endpoint's busy inputs changed (its lanes
// are rechecked at the next Drain). Unknown addresses are ignored.
//
// A fresh scrape first reconciles the endpoint's ledger with the engine's
// counts (ledger.go). Then the busy test's view of load the picker's
// charges do not cover: every request in the engine's waiting queue is
// load, whoever sent it, less at most peakOurs of them (the most of our
// requests charged there with an open stream since the previous
// delivery, so requests whose first byte came between the scrape and its
// delivery are not counted twice). Each such request counts as the moving
// mean of the prompts we dispatch in prefill tokens. Running requests
// count only in the cost picker's decode load.
func (c *Core) SetMetrics(now int64, addr string, m podmetrics.Metrics, stale bool) bool {
	e, ok := c.reg.byAddr[addr]
	if !ok {
		return false
	}
	changed := e.stale != stale
	e.stale = stale
	if !stale {
		if c.reconcile(now, e, &m) {
			changed = true
		}
		ours := max(e.peakOurs, e.ours())
		e.peakOurs = e.ours()
		unseen := 0
		if m.Has(podmetrics.Waiting) {
			unseen = max(0, m.Waiting-ours)
			wasOver := c.overloaded(e)
			e.waiting = m.Waiting
			if c.overloaded(e) != wasOver {
				changed = true
			}
		}
		prefill := drr.SaturatingMul(uint64(unseen), c.meanPrompt)
		if prefill != e.unseenPrefill {
			changed = true
		}
		e.unseenWaiting, e.unseenPrefill, e.drainAt = unseen, prefill, now
		if unseen > 0 {
			c.listDraining(e)
		}
		e.running = m.Running
		if m.Has(podmetrics.KVCacheUsage) {
			e.kvUsage = m.KVCacheUsage // orders decode pods (roles.go)
		}
		c.setLoRA(e, &m) // LoRA affinity (lora.go)
		if kv := kvTokens(&m); c.index != nil && kv > 0 {
			c.index.SetCapacity(int(e.id), kv)
		}
		if c.observeAuto(now, e, &m) {
			changed = true
		}
		bs := 0
		if m.Has(podmetrics.BlockSize) {
			bs = min(m.BlockSize, MaxEngineBlockSize)
		}
		if bs != e.engineBS {
			e.engineBS = bs
			c.updateHashBlockSize()
		}
	}
	if changed {
		c.q.EndpointChanged(e.id)
	}
	return changed
}

// updateHashBlockSize sets the hashing block size to the configured one or
// the largest block size a live endpoint reports (at most
// MaxEngineBlockSize), whichever is larger: a
// coarser hash than the engine's only rounds the overlap down, and an
// engine with token-sized pages (SGLang's default) must not make the
// parser hash every token.
func (c *Core) updateHashBlockSize() {
	bs := c.baseBS
	for _, id := range c.reg.live {
		bs = max(bs, c.reg.eps[id].engineBS)
	}
	c.hashBS = bs
}

// observeAuto feeds a fresh scrape to e's auto threshold (SPEC §5,
// pkg/autothreshold) and reports whether the threshold moved. The picker
// holds requests for e when requests are queued and e is over its
// threshold: a queued request that could go there would have gone at the
// last Drain.
func (c *Core) observeAuto(now int64, e *endpoint, m *podmetrics.Metrics) bool {
	if !c.hasAuto {
		return false
	}
	load := e.load()
	move := e.auto.Observe(autothreshold.Sample{
		At: now, Waiting: m.Waiting, HasWaiting: m.Has(podmetrics.Waiting),
		Running: m.Running, HasRunning: m.Has(podmetrics.Running),
		Load: load, MeanPrompt: c.meanPrompt,
		Held:    c.q.Len() > 0 && load > e.auto.Threshold(),
		KVUsage: m.KVCacheUsage, HasKV: m.Has(podmetrics.KVCacheUsage),
		KVTokens: kvTokens(m), AskedOutput: c.askedOutput(e),
		GenerationTokens: m.GenerationTokens, Finished: m.Finished,
		HasOutput: m.Has(podmetrics.GenerationTokens | podmetrics.Finished),
	})
	return move != autothreshold.Hold
}

// askedOutput is the mean output requests asked for, as e's auto threshold
// weighs it: none on a prefill-only pod, which holds a request only for
// its prefill (what the request generates fills its decode pod's cache).
func (c *Core) askedOutput(e *endpoint) uint64 {
	if e.role == RolePrefill {
		return 0
	}
	return c.meanOutput
}

// kvTokens is the engine's KV cache in tokens, 0 when unknown.
func kvTokens(m *podmetrics.Metrics) uint64 {
	if !m.Has(podmetrics.NumBlocks | podmetrics.BlockSize) {
		return 0
	}
	return drr.SaturatingMul(uint64(m.NumBlocks), uint64(m.BlockSize))
}
