package engine

import "testing"

func TestBlockPool(t *testing.T) {
	hA := []uint64{1, 2, 3}
	hB := []uint64{1, 2, 9}
	hC := []uint64{7, 8}

	type step struct {
		op     string // "acquire", "register", "release"
		who    string
		hashes []uint64
		need   int
		wantOK bool // acquire
		hit    int  // expected match before acquire
		used   int  // pool.used after the step
		lru    int  // pool.lruLen after the step
		cached int  // len(pool.cached) after the step
	}
	tests := []struct {
		name   string
		total  int
		prefix bool
		steps  []step
	}{
		{
			name: "reuse after release", total: 8, prefix: true,
			steps: []step{
				{op: "acquire", who: "a", hashes: hA, need: 4, wantOK: true, hit: 0, used: 4},
				{op: "register", who: "a", hashes: hA, used: 4, cached: 3},
				{op: "release", who: "a", used: 0, lru: 3, cached: 3},
				{op: "acquire", who: "b", hashes: hB, need: 4, wantOK: true, hit: 2, used: 4, lru: 1, cached: 3},
				{op: "register", who: "b", hashes: hB, used: 4, lru: 1, cached: 4},
				{op: "release", who: "b", used: 0, lru: 4, cached: 4},
			},
		},
		{
			name: "eviction takes the least recently released", total: 4, prefix: true,
			steps: []step{
				{op: "acquire", who: "a", hashes: hA, need: 3, wantOK: true, used: 3},
				{op: "register", who: "a", hashes: hA, used: 3, cached: 3},
				{op: "release", who: "a", used: 0, lru: 3, cached: 3},
				// C needs 3 fresh blocks: 1 empty + 2 evicted (hashes 1 and 2).
				{op: "acquire", who: "c", hashes: hC, need: 3, wantOK: true, used: 3, lru: 1, cached: 1},
				// Hash 1 went first, so A's prefix no longer matches at all.
				{op: "acquire", who: "d", hashes: hA, need: 1, wantOK: true, hit: 0, used: 4, lru: 0, cached: 0},
			},
		},
		{
			name: "no room, nothing changes", total: 4, prefix: true,
			steps: []step{
				{op: "acquire", who: "a", hashes: hA, need: 3, wantOK: true, used: 3},
				{op: "acquire", who: "b", hashes: hC, need: 2, wantOK: false, used: 3},
				{op: "release", who: "a", used: 0},
				{op: "acquire", who: "b", hashes: hC, need: 2, wantOK: true, used: 2},
			},
		},
		{
			name: "shared hits are counted once", total: 8, prefix: true,
			steps: []step{
				{op: "acquire", who: "a", hashes: hA, need: 3, wantOK: true, used: 3},
				{op: "register", who: "a", hashes: hA, used: 3, cached: 3},
				{op: "acquire", who: "b", hashes: hA, need: 4, wantOK: true, hit: 3, used: 4, cached: 3},
				{op: "release", who: "a", used: 4, cached: 3},
				{op: "release", who: "b", used: 0, lru: 3, cached: 3},
			},
		},
		{
			name: "prefix caching off", total: 8, prefix: false,
			steps: []step{
				{op: "acquire", who: "a", hashes: hA, need: 3, wantOK: true, used: 3},
				{op: "register", who: "a", hashes: hA, used: 3},
				{op: "release", who: "a", used: 0},
				{op: "acquire", who: "b", hashes: hA, need: 3, wantOK: true, hit: 0, used: 3},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newBlockPool(tt.total, tt.prefix)
			allocs := map[string]*allocation{}
			for i, st := range tt.steps {
				switch st.op {
				case "acquire":
					hit := p.match(st.hashes)
					if hit != st.hit {
						t.Fatalf("step %d: match = %d, want %d", i, hit, st.hit)
					}
					a, ok := p.acquire(st.hashes, hit, st.need)
					if ok != st.wantOK {
						t.Fatalf("step %d: acquire ok = %v, want %v", i, ok, st.wantOK)
					}
					if ok {
						allocs[st.who] = &a
					}
				case "register":
					a := allocs[st.who]
					p.register(a, st.hashes, len(a.hits))
				case "release":
					p.release(allocs[st.who])
				}
				if p.used != st.used || p.lruLen != st.lru || len(p.cached) != st.cached {
					t.Fatalf("step %d (%s %s): used/lru/cached = %d/%d/%d, want %d/%d/%d",
						i, st.op, st.who, p.used, p.lruLen, len(p.cached), st.used, st.lru, st.cached)
				}
				if p.used+p.lruLen > p.total {
					t.Fatalf("step %d: used %d + idle cached %d exceed %d blocks", i, p.used, p.lruLen, p.total)
				}
			}
		})
	}
}
