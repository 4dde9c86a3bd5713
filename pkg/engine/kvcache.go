package engine

// cachedBlock is a KV block whose content is a known prompt prefix.
type cachedBlock struct {
	hash       uint64
	refs       int          // running requests using it
	prev, next *cachedBlock // LRU list links while refs == 0
}

// blockPool counts KV cache blocks. It tracks no block ids, only how many
// blocks are in use and which prefix blocks are cached. The engine goroutine
// owns it.
//
// Invariant: used + len(lru) <= total; the remaining blocks are empty.
type blockPool struct {
	total   int
	used    int // blocks held by running requests, cached or not
	prefix  bool
	cached  map[uint64]*cachedBlock
	lruHead *cachedBlock // least recently released; evicted first
	lruTail *cachedBlock
	lruLen  int
}

func newBlockPool(total int, prefixCaching bool) *blockPool {
	return &blockPool{total: total, prefix: prefixCaching, cached: make(map[uint64]*cachedBlock)}
}

// allocation is what one request holds.
type allocation struct {
	hits  []*cachedBlock // leading cached blocks it reuses, and blocks it registered
	plain int            // other blocks
}

// match returns how many leading hashes are cached.
func (p *blockPool) match(hashes []uint64) int {
	if !p.prefix {
		return 0
	}
	n := 0
	for _, h := range hashes {
		if _, ok := p.cached[h]; !ok {
			break
		}
		n++
	}
	return n
}

// acquire reserves blocks for a request needing need blocks in all, of which
// the first hit hashes are cached. It reports false, changing nothing, when
// the blocks are not available.
func (p *blockPool) acquire(hashes []uint64, hit, need int) (allocation, bool) {
	reviving := 0 // cached hits that are idle: they move from the LRU to used
	for _, h := range hashes[:hit] {
		if p.cached[h].refs == 0 {
			reviving++
		}
	}
	fresh := need - hit
	// Idle cached blocks other than our hits can be evicted for fresh ones.
	if p.used+reviving+fresh > p.total {
		return allocation{}, false
	}
	a := allocation{hits: make([]*cachedBlock, 0, hit), plain: fresh}
	for _, h := range hashes[:hit] {
		b := p.cached[h]
		if b.refs == 0 {
			p.unlink(b)
			p.used++
		}
		b.refs++
		a.hits = append(a.hits, b)
	}
	for range fresh {
		if p.used+p.lruLen >= p.total {
			p.evict()
		}
		p.used++
	}
	return a, true
}

// register turns the request's fresh blocks holding full prompt blocks
// (hashes[from:]) into cached blocks, once their prefill is done. A hash
// already cached by another request stays a plain block of this one.
func (p *blockPool) register(a *allocation, hashes []uint64, from int) {
	if !p.prefix {
		return
	}
	for _, h := range hashes[from:] {
		if a.plain == 0 {
			return
		}
		if _, ok := p.cached[h]; ok {
			continue
		}
		b := &cachedBlock{hash: h, refs: 1}
		p.cached[h] = b
		a.hits = append(a.hits, b)
		a.plain--
	}
}

// release returns a request's blocks: plain ones become empty, cached ones
// join the LRU when no other request uses them.
func (p *blockPool) release(a *allocation) {
	p.used -= a.plain
	for _, b := range a.hits {
		b.refs--
		if b.refs == 0 {
			p.used--
			p.pushLRU(b)
		}
	}
	*a = allocation{}
}

func (p *blockPool) pushLRU(b *cachedBlock) {
	b.prev, b.next = p.lruTail, nil
	if p.lruTail != nil {
		p.lruTail.next = b
	} else {
		p.lruHead = b
	}
	p.lruTail = b
	p.lruLen++
}

func (p *blockPool) unlink(b *cachedBlock) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		p.lruHead = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		p.lruTail = b.prev
	}
	b.prev, b.next = nil, nil
	p.lruLen--
}

// evict drops the least recently released cached block.
func (p *blockPool) evict() {
	b := p.lruHead
	p.unlink(b)
	delete(p.cached, b.hash)
}
