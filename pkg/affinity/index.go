package affinity

import (
	"math/bits"
	"time"
)

// Sparse positions: every block below denseBlocks, then perOctave positions
// per doubling of the position.
const (
	denseBits   = 6
	denseBlocks = 1 << denseBits // 64
	perOctave   = denseBlocks / 2
)

// stride is the distance between stored positions around block p.
func stride(p int) int {
	if p < denseBlocks {
		return 1
	}
	return 1 << (bits.Len(uint(p)) - denseBits)
}

// gridAtOrBelow is the largest stored (grid) position <= p, for p >= 0.
func gridAtOrBelow(p int) int { return p - p%stride(p) }

// gridCount is how many grid positions are < n.
func gridCount(n int) int {
	if n <= denseBlocks {
		return n
	}
	last := n - 1
	k := bits.Len(uint(last)) - denseBits - 1 // octave of the last position, from 0
	oct := 1 << (k + denseBits)               // its first position; stride 2<<k
	return denseBlocks + k*perOctave + (last-oct)/(2<<k) + 1
}

// gridPos is the i-th grid position (inverse of gridCount).
func gridPos(i int) int {
	if i < denseBlocks {
		return i
	}
	k := (i - denseBlocks) / perOctave
	j := (i - denseBlocks) % perOctave
	return (1 << (k + denseBits)) + j*(2<<k)
}

// GridStride is the distance from block position p to the next position
// of the index's sparse grid, for p on the grid (OnGrid); the grid starts
// at 0. It states what the index reads of a hash chain: Overlap(slot,
// hashes, now) reads hashes[p] only for grid positions p and for
// len(hashes)-1, and Record(slot, hashes, ...) the same. A chain that
// holds the right hashes at those positions and anything elsewhere gives
// the same overlaps, records the same entries and ages out the same way,
// which is what lets a replica send only them (pkg/replica). The grid is
// part of that wire format: changing it changes pkg/replica's Version.
func GridStride(p int) int { return stride(max(p, 0)) }

// OnGrid reports whether block position p is on the sparse grid.
func OnGrid(p int) bool { return p >= 0 && p%stride(p) == 0 }

// IndexOptions configure an Index.
type IndexOptions struct {
	// TTL is how long an entry counts after the last prompt that used it
	// was routed; zero means entries age out by capacity only.
	TTL time.Duration
	// DefaultCapacity is an endpoint's cache size in tokens until
	// SetCapacity says otherwise (the engine's num_gpu_blocks × block_size
	// once scraped). Zero means DefaultCapacityTokens.
	DefaultCapacity uint64
	// MaxEntries bounds one endpoint's entries whatever its capacity, so a
	// large cache filled with short prompts cannot grow the picker without
	// bound. Zero means DefaultMaxEntries.
	MaxEntries int
}

// Defaults of IndexOptions.
const (
	// DefaultCapacityTokens is 16,384 blocks of 16 tokens.
	DefaultCapacityTokens = 16384 * 16
	// DefaultMaxEntries bounds an endpoint's index at about 2 MiB.
	DefaultMaxEntries = 1 << 16
)

// Index is the approximate per-endpoint prefix-cache index. Endpoints are
// numbered by small non-negative slots (the dispatcher's endpoint IDs). It
// is not safe for concurrent use: one goroutine (the dispatcher loop) owns
// it.
type Index struct {
	opts IndexOptions
	ttl  int64
	eps  []*epIndex // by slot; nil until first used
}

// epIndex is one endpoint's entries and their eviction queue.
type epIndex struct {
	m    map[uint64]entry
	ring []ringRec // eviction order: oldest first, from head
	head int
	live uint64 // tokens represented by the entries in m
	cap  uint64
	seq  uint64
}

// entry is one stored block hash.
type entry struct {
	seq    uint64 // of the ring record that is its latest touch
	at     int64  // time of the latest touch (caller's clock, ns)
	weight uint32 // tokens it stands for (its stride × block size)
}

// ringRec queues an entry's touch for eviction; a record whose seq no
// longer matches its entry was superseded by a later touch.
type ringRec struct {
	hash uint64
	seq  uint64
}

// NewIndex returns an empty index.
func NewIndex(o IndexOptions) *Index {
	if o.DefaultCapacity == 0 {
		o.DefaultCapacity = DefaultCapacityTokens
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	return &Index{opts: o, ttl: int64(o.TTL)}
}

func (x *Index) ep(slot int, create bool) *epIndex {
	if slot < 0 {
		return nil
	}
	if slot >= len(x.eps) {
		if !create {
			return nil
		}
		x.eps = append(x.eps, make([]*epIndex, slot+1-len(x.eps))...)
	}
	e := x.eps[slot]
	if e == nil && create {
		e = &epIndex{m: make(map[uint64]entry), cap: x.opts.DefaultCapacity}
		x.eps[slot] = e
	}
	return e
}

// fresh reports whether e still counts at time now.
func (x *Index) fresh(e entry, now int64) bool {
	return x.ttl <= 0 || now-e.at <= x.ttl
}

// Overlap returns how many leading blocks of a prompt with these chained
// block hashes the endpoint in slot probably has cached, as of now. The
// answer is exact at the stored positions and rounds down between them.
func (x *Index) Overlap(slot int, hashes []uint64, now int64) int {
	e := x.ep(slot, false)
	n := len(hashes)
	if e == nil || n == 0 || len(e.m) == 0 {
		return 0
	}
	has := func(p int) bool {
		en, ok := e.m[hashes[p]]
		return ok && x.fresh(en, now)
	}
	if !has(0) {
		return 0 // the common answer: nothing of this prompt was sent here
	}
	if has(n - 1) {
		return n // the whole prompt (the last block is always stored)
	}
	// Binary search over the grid positions below n-1: lo is present, hi
	// is absent (position n-1 stands in for hi = count).
	lo, hi := 0, gridCount(n-1)
	for hi-lo > 1 {
		mid := int(uint(lo+hi) >> 1)
		if has(gridPos(mid)) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return gridPos(lo) + 1
}

// Record notes that a prompt with these block hashes (blockSize tokens per
// block) was routed to the endpoint in slot at time now, then ages the
// endpoint's entries out past its capacity and the TTL.
func (x *Index) Record(slot int, hashes []uint64, blockSize int, now int64) {
	n := len(hashes)
	if n == 0 || blockSize <= 0 {
		return
	}
	e := x.ep(slot, true)
	if e == nil {
		return
	}
	// Tail first, so that the tail is queued for eviction before the head.
	p := n - 1
	weight := p - gridAtOrBelow(max(p-1, 0))
	if p == 0 {
		weight = 1
	}
	for {
		x.touch(e, hashes[p], uint32(min(weight*blockSize, 1<<31)), now)
		if p == 0 {
			break
		}
		p = gridAtOrBelow(p - 1)
		weight = stride(p)
	}
	x.evict(e, now)
}

func (x *Index) touch(e *epIndex, h uint64, weight uint32, now int64) {
	e.seq++
	old, ok := e.m[h]
	if ok {
		e.live -= uint64(old.weight)
	}
	e.m[h] = entry{seq: e.seq, at: now, weight: weight}
	e.live += uint64(weight)
	e.ring = append(e.ring, ringRec{hash: h, seq: e.seq})
}

// evict drops the oldest entries while the endpoint is over capacity or
// over MaxEntries, and entries past the TTL; then compacts the queue.
func (x *Index) evict(e *epIndex, now int64) {
	for e.head < len(e.ring) {
		r := e.ring[e.head]
		en, ok := e.m[r.hash]
		if !ok || en.seq != r.seq {
			e.head++ // superseded by a later touch
			continue
		}
		if e.live <= e.cap && len(e.m) <= x.opts.MaxEntries && x.fresh(en, now) {
			break
		}
		delete(e.m, r.hash)
		e.live -= uint64(en.weight)
		e.head++
	}
	// Drop consumed records once they are half the queue, and superseded
	// ones once they outnumber live entries, keeping order: amortised O(1)
	// per touch and a queue at most about twice the entries.
	if e.head >= 1024 && e.head >= len(e.ring)/2 {
		e.ring = append(e.ring[:0], e.ring[e.head:]...)
		e.head = 0
	}
	if len(e.ring)-e.head > 2*len(e.m)+1024 {
		kept := e.ring[:0]
		for _, r := range e.ring[e.head:] {
			if en, ok := e.m[r.hash]; ok && en.seq == r.seq {
				kept = append(kept, r)
			}
		}
		e.ring, e.head = kept, 0
	}
}

// SetCapacity sets the endpoint's cache size in tokens (0 restores the
// default); entries beyond it age out at the next Record.
func (x *Index) SetCapacity(slot int, tokens uint64) {
	if tokens == 0 {
		tokens = x.opts.DefaultCapacity
	}
	if e := x.ep(slot, true); e != nil {
		e.cap = tokens
	}
}

// Drop forgets the endpoint in slot (it left the pool; the slot may be
// reused by another endpoint).
func (x *Index) Drop(slot int) {
	if slot >= 0 && slot < len(x.eps) {
		x.eps[slot] = nil
	}
}

// Stats is one endpoint's index size.
type Stats struct {
	// Entries is the number of stored block hashes; Tokens the prompt
	// tokens they stand for.
	Entries int
	Tokens  uint64
}

// Stats returns the size of the endpoint's index.
func (x *Index) Stats(slot int) Stats {
	e := x.ep(slot, false)
	if e == nil {
		return Stats{}
	}
	return Stats{Entries: len(e.m), Tokens: e.live}
}
