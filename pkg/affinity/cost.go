package affinity

import "math/rand/v2"

// Load is one candidate endpoint as the cost ranking sees it. Token counts
// are converted to blocks of the request's block size.
type Load struct {
	// Stale: the endpoint's metrics are stale or were never scraped; it
	// ranks after every endpoint with fresh metrics.
	Stale bool
	// Busy: the request's class finds the endpoint busy; it ranks after
	// every endpoint that is not.
	Busy bool
	// Prefill is the prompt tokens the request would prefill there: its
	// tokens minus the endpoint's cached overlap.
	Prefill uint64
	// ActivePrefill is the prompt tokens already in prefill there (this
	// picker's, plus its estimate of load it did not send).
	ActivePrefill uint64
	// Decode is the sequences running (decoding) there; each counts as one
	// block. A decoding sequence adds one token and its attention to every
	// engine step, which slows a new prefill far less than a queued prompt
	// does, so prefill stays the dominant term, as it is for the time to
	// first token.
	Decode uint64
	// Affinity is a preference among endpoints of the same stale and busy
	// tier, before cost: lower first, 0..3 (larger counts as 3). The
	// picker's LoRA adapter tier; 0 for every candidate of a request
	// without one.
	Affinity uint8
}

// blocks is tokens in blocks of bs, rounded up.
func blocks(tokens uint64, bs uint64) uint64 { return tokens/bs + min(tokens%bs, 1) }

// Cost is the endpoint's cost for the request in blocks of blockSize
// tokens: prefill blocks after overlap + active prefill blocks + running
// sequences. A blockSize below 1 counts tokens.
func (l *Load) Cost(blockSize int) uint64 {
	bs := uint64(max(blockSize, 1))
	c := blocks(l.Prefill, bs) + blocks(l.ActivePrefill, bs)
	if c+l.Decode < c {
		return ^uint64(0)
	}
	return c + l.Decode
}

// tier orders stale after busy after the rest.
func (l *Load) tier() uint64 {
	switch {
	case l.Stale:
		return 2
	case l.Busy:
		return 1
	}
	return 0
}

// Key layout: tier (2 bits) | affinity (2 bits) | cost (36 bits,
// saturated) | random (24 bits).
const (
	affinityBits = 2
	costBits     = 36
	randBits     = 24
	maxCost      = 1<<costBits - 1
)

// Ranker orders candidates by Load. It keeps scratch space and a random
// source, so it is owned by one goroutine (the dispatcher loop).
type Ranker struct {
	rng  *rand.Rand
	keys []uint64
}

// NewRanker returns a ranker whose tie-breaks come from seed (a fixed seed
// makes tests repeatable).
func NewRanker(seed uint64) *Ranker {
	return &Ranker{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Rank appends the index of every load to out and returns it: the best
// min(want, len(loads)) first, in order — lower tier, then lower affinity,
// then lower cost, then a random tie-break — and the rest after them in no particular order. It
// takes O(len(loads) × want).
func (r *Ranker) Rank(loads []Load, blockSize, want int, out []int) []int {
	n := len(loads)
	base := len(out)
	r.keys = r.keys[:0]
	for i := range loads {
		l := &loads[i]
		c := min(l.Cost(blockSize), maxCost)
		a := uint64(min(l.Affinity, 1<<affinityBits-1))
		r.keys = append(r.keys, l.tier()<<(affinityBits+costBits+randBits)|a<<(costBits+randBits)|c<<randBits|r.rng.Uint64()>>(64-randBits))
		out = append(out, i)
	}
	idx := out[base:]
	want = min(want, n)
	for i := 0; i < want; i++ {
		best := i
		for j := i + 1; j < n; j++ {
			if r.keys[j] < r.keys[best] {
				best = j
			}
		}
		r.keys[i], r.keys[best] = r.keys[best], r.keys[i]
		idx[i], idx[best] = idx[best], idx[i]
	}
	return out
}
