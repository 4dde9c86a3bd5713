package drr

import (
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"
)

// The fuzz target drives a Scheduler with a random sequence of operations
// and checks it against a reference model after every step.

const fzEndpoints = 4

// Endpoint states of the fuzz world.
const (
	fzIdle = iota
	fzBusy
	fzGone
)

// fzReq is the payload of a fuzz request: its allow-list when unpinned,
// and its tenant.
type fzReq struct {
	id     int
	mask   uint8 // bit e: endpoint e is eligible (shared requests)
	tenant string
}

type fzWorld struct {
	t     *testing.T
	s     *Scheduler
	cfgs  []ClassConfig
	state [fzEndpoints]uint8
	now   int64

	live   map[*Item]bool
	all    []*Item
	gone   map[*Item]bool
	n      []int
	raw    []*big.Int
	cached []*big.Int
}

func (w *fzWorld) Shared(class int, it *Item) Verdict { return w.verdict(it) }

func (w *fzWorld) Lane(class int, ep EndpointID) Verdict {
	switch w.state[ep] {
	case fzIdle:
		return Ready
	case fzBusy:
		return Blocked
	}
	return Unroutable
}

// verdict is the current truth about an item as the head of its lane.
func (w *fzWorld) verdict(it *Item) Verdict {
	if it.Pinned != NoEndpoint {
		return w.Lane(int(it.Class), it.Pinned)
	}
	mask := it.Payload.(*fzReq).mask
	eligible, idle := 0, 0
	for e := 0; e < fzEndpoints; e++ {
		if mask&(1<<e) != 0 && w.state[e] != fzGone {
			eligible++
			if w.state[e] == fzIdle {
				idle++
			}
		}
	}
	switch {
	case eligible == 0:
		return Unroutable
	case idle > 0:
		return Ready
	}
	return Blocked
}

type fzReader struct {
	b []byte
	i int
}

func (r *fzReader) next() byte {
	if r.i >= len(r.b) {
		return 0
	}
	r.i++
	return r.b[r.i-1]
}

func (r *fzReader) more() bool { return r.i < len(r.b) }

func pick[T any](r *fzReader, xs ...T) T { return xs[int(r.next())%len(xs)] }

func satBig(x *big.Int) uint64 {
	if x.IsUint64() {
		return x.Uint64()
	}
	return math.MaxUint64
}

func FuzzScheduler(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{2, 1, 0, 1, 9, 2, 1, 1, 3, 0, 0, 0, 0, 5, 0, 1, 1, 2, 2, 6})
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 8; i++ {
		b := make([]byte, 64+rng.IntN(2000))
		for j := range b {
			b[j] = byte(rng.UintN(256))
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		runFuzz(t, data)
	})
}

func runFuzz(t *testing.T, data []byte) {
	r := &fzReader{b: data}
	nc := 1 + int(r.next())%3
	cfgs := make([]ClassConfig, nc)
	for i := range cfgs {
		cfgs[i] = ClassConfig{
			Name:                  fmt.Sprintf("c%d", i),
			Quantum:               pick[uint64](r, 1, 2, 3, 7, 10, 64, 1000, math.MaxUint64/3),
			Policy:                Policy(r.next() % 3),
			Queueing:              r.next()%5 != 0,
			RequestLimitPerWorker: pick(r, NoLimit, NoLimit, NoLimit, 0, 1, 3, 8),
			RawISLLimitPerWorker:  pick(r, NoLimit, NoLimit, NoLimit, 100, 5000, math.MaxUint64/2+1),
			CachedLimitPerWorker:  pick(r, NoLimit, NoLimit, NoLimit, 50, 1000),
			WaitBudget:            pick[time.Duration](r, 0, 0, 50, 500),
			TenantFairness:        r.next()%3 == 0,
		}
	}
	s, err := New(cfgs)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	w := &fzWorld{
		t: t, s: s, cfgs: cfgs,
		live: map[*Item]bool{}, gone: map[*Item]bool{},
		n: make([]int, nc), raw: make([]*big.Int, nc), cached: make([]*big.Int, nc),
	}
	for i := 0; i < nc; i++ {
		w.raw[i], w.cached[i] = new(big.Int), new(big.Int)
	}
	for step := 0; r.more() && step < 3000; step++ {
		switch r.next() % 10 {
		case 0, 1, 2:
			w.offer(r)
		case 3, 4:
			w.pop()
		case 5:
			if len(w.all) > 0 {
				it := w.all[int(r.next())%len(w.all)]
				want := w.live[it]
				if got := s.Remove(it); got != want {
					t.Fatalf("Remove(item %d) = %v; want %v (queued %v)", it.Seq(), got, want, want)
				}
				if want {
					w.leave(it)
				}
			}
		case 6:
			ep := r.next() % fzEndpoints
			w.state[ep] = r.next() % 3
			s.EndpointChanged(EndpointID(ep))
		case 7:
			w.now += int64(r.next()) * 5
		case 8:
			w.drain()
		case 9:
			w.rotate(int(r.next()) % nc)
		}
		w.check()
	}
	// Liveness: with every endpoint idle, everything leaves.
	for e := range w.state {
		w.state[e] = fzIdle
		s.EndpointChanged(EndpointID(e))
	}
	w.drain()
	if s.Len() != 0 || len(w.live) != 0 {
		t.Fatalf("after a final drain with every endpoint idle: Len %d, model %d; want 0", s.Len(), len(w.live))
	}
	w.check()
}

func (w *fzWorld) offer(r *fzReader) {
	t, s := w.t, w.s
	class := int(r.next()) % len(w.cfgs)
	req := Request{Class: int32(class), Pinned: NoEndpoint}
	fr := &fzReq{id: len(w.all)}
	if e := r.next() % 6; e < fzEndpoints {
		req.Pinned = EndpointID(e)
	} else {
		fr.mask = r.next() % 16
	}
	fr.tenant = pick(r, "", "a", "b", "c")
	req.Payload = fr
	v := uint64(r.next())
	req.RawISL = pick(r, v, v*100, v*37+1, math.MaxUint64-v)
	req.Cached = pick(r, 0, req.RawISL/2, req.RawISL, req.RawISL+5, uint64(r.next()))
	req.Priority = int32(int8(r.next()))
	req.StrictPriority = uint32(r.next() % 3)
	if r.next()%4 == 0 {
		req.Due = w.now + int64(r.next())*10
	}
	req.Arrival = w.now - int64(r.next()%4)*30
	endpoints := int(r.next() % 5)
	allBusy := r.next()%4 != 0

	cfg := w.cfgs[class]
	direct := !cfg.Queueing || (w.n[class] == 0 && !allBusy)
	var want *Rejection
	if !direct {
		eps := uint64(endpoints)
		checks := []struct {
			kind           LimitKind
			perWorker, cur uint64
		}{
			{LimitRequests, cfg.RequestLimitPerWorker, uint64(w.n[class])},
			{LimitRawISLTokens, cfg.RawISLLimitPerWorker, satBig(w.raw[class])},
			{LimitCachedTokens, cfg.CachedLimitPerWorker, satBig(w.cached[class])},
		}
		for _, c := range checks {
			if c.perWorker == NoLimit {
				continue
			}
			limit := new(big.Int).Mul(new(big.Int).SetUint64(c.perWorker), new(big.Int).SetUint64(eps))
			if c.cur >= satBig(limit) {
				want = &Rejection{Class: cfg.Name, Kind: c.kind, Current: c.cur, Limit: satBig(limit)}
				break
			}
		}
	}
	it, err := s.Offer(req, Tenant{Name: fr.tenant, Weight: uint64(len(fr.tenant) + int(r.next()%3))}, endpoints, allBusy)
	switch {
	case direct:
		if it != nil || err != nil {
			t.Fatalf("Offer = %v, %v; want direct dispatch (queueing %v, pending %d, allBusy %v)", it, err, cfg.Queueing, w.n[class], allBusy)
		}
	case want != nil:
		rej, ok := err.(*Rejection)
		if it != nil || !ok || *rej != *want {
			t.Fatalf("Offer = %v, %v; want rejection %+v", it, err, want)
		}
	default:
		if it == nil || err != nil {
			t.Fatalf("Offer = %v, %v; want queued", it, err)
		}
		if it.Cached > it.RawISL {
			t.Fatalf("queued cached %d > raw %d: not clamped", it.Cached, it.RawISL)
		}
		w.live[it] = true
		w.all = append(w.all, it)
		w.n[class]++
		w.raw[class].Add(w.raw[class], new(big.Int).SetUint64(it.RawISL))
		w.cached[class].Add(w.cached[class], new(big.Int).SetUint64(it.Cached))
	}
}

// leave records that a live item left the queue, exactly once.
func (w *fzWorld) leave(it *Item) {
	if !w.live[it] {
		if w.gone[it] {
			w.t.Fatalf("item %d left twice", it.Seq())
		}
		w.t.Fatalf("item %d left but was never queued", it.Seq())
	}
	if it.Queued() {
		w.t.Fatalf("item %d left but reports Queued", it.Seq())
	}
	delete(w.live, it)
	w.gone[it] = true
	c := it.Class
	w.n[c]--
	w.raw[c].Sub(w.raw[c], new(big.Int).SetUint64(it.RawISL))
	w.cached[c].Sub(w.cached[c], new(big.Int).SetUint64(it.Cached))
}

func (w *fzWorld) expiryOf(it *Item) (int64, bool) {
	b := w.cfgs[it.Class].WaitBudget
	if b <= 0 {
		return 0, false
	}
	return satAddInt64(it.Arrival, int64(b)), true
}

// headsBlocked reports whether class c has queued items and every head of
// its lanes is Blocked now.
func (w *fzWorld) headsBlocked(c int) bool {
	cl := w.s.classes[c]
	if cl.n == 0 {
		return false
	}
	if h := cl.sharedHead(); h != nil && w.verdict(h) != Blocked {
		return false
	}
	for it := range w.live {
		if int(it.Class) == c && it.Pinned != NoEndpoint && w.verdict(it) != Blocked {
			return false
		}
	}
	return true
}

func (w *fzWorld) pop() Outcome {
	t, s := w.t, w.s
	nc := len(w.cfgs)
	d0 := deficits(s)
	cursor := s.cursor
	blocked := make([]bool, nc)
	for c := range blocked {
		blocked[c] = w.headsBlocked(c)
	}
	var firstExp *Item
	var firstAt int64
	for it := range w.live {
		if at, ok := w.expiryOf(it); ok && at <= w.now && (firstExp == nil || at < firstAt) {
			firstExp, firstAt = it, at
		}
	}
	it, out := s.Pop(w.now, w)
	d1 := deficits(s)
	if out == None {
		if it != nil {
			t.Fatalf("Pop = %v, None", it)
		}
		if firstExp != nil {
			t.Fatalf("Pop = None with item %d expired at %d <= now %d", firstExp.Seq(), firstAt, w.now)
		}
		for c := range d1 {
			if d1[c] != d0[c] {
				t.Fatalf("Pop = None changed class %d deficit %d -> %d", c, d0[c], d1[c])
			}
		}
		for x := range w.live {
			if x.Pinned != NoEndpoint && w.verdict(x) != Blocked {
				t.Fatalf("Pop = None with lane %d of class %d %v", x.Pinned, x.Class, w.verdict(x))
			}
		}
		for c, cl := range s.classes {
			if h := cl.sharedHead(); h != nil && w.verdict(h) != Blocked {
				t.Fatalf("Pop = None with class %d shared head %v", c, w.verdict(h))
			}
		}
		return out
	}
	if it == nil {
		t.Fatalf("Pop outcome %v with a nil item", out)
	}
	cls := int(it.Class)
	w.leave(it)
	if out != Expired && firstExp != nil {
		t.Fatalf("Pop = %v while item %d had expired at %d <= now %d", out, firstExp.Seq(), firstAt, w.now)
	}
	switch out {
	case Expired, NoRoute:
		if out == Expired {
			at, ok := w.expiryOf(it)
			if !ok || at > w.now || at != firstAt {
				t.Fatalf("Expired item %d expires at %d (%v); now %d, earliest %d", it.Seq(), at, ok, w.now, firstAt)
			}
		} else if v := w.verdict(it); v != Unroutable {
			t.Fatalf("NoRoute item %d has verdict %v", it.Seq(), v)
		}
		if s.cursor != cursor {
			t.Fatalf("%v moved the cursor %d -> %d", out, cursor, s.cursor)
		}
		for c := range d1 {
			if d1[c] != d0[c] && !(c == cls && w.n[c] == 0 && d1[c] == 0) {
				t.Fatalf("%v changed class %d deficit %d -> %d", out, c, d0[c], d1[c])
			}
		}
	case Dispatch:
		if v := w.verdict(it); v != Ready {
			t.Fatalf("dispatched item %d (class %d, pinned %d) whose verdict is %v", it.Seq(), cls, it.Pinned, v)
		}
		fair := w.cfgs[cls].TenantFairness && it.Pinned == NoEndpoint
		for x := range w.live {
			sameLane := int(x.Class) == cls && x.Pinned == it.Pinned &&
				(!fair || x.Payload.(*fzReq).tenant == it.Payload.(*fzReq).tenant)
			if sameLane && before(x, it) {
				t.Fatalf("dispatched item %d ahead of item %d of its own lane", it.Seq(), x.Seq())
			}
		}
		for c := range d1 {
			b, a := d0[c], d1[c]
			q := w.cfgs[c].Quantum
			if w.n[c] == 0 {
				if a != 0 {
					t.Fatalf("empty class %d kept deficit %d", c, a)
				}
				continue
			}
			if c != cls {
				if blocked[c] && a != b {
					t.Fatalf("blocked class %d earned credit: %d -> %d", c, b, a)
				}
				if a < b || (a != math.MaxUint64 && (a-b)%q != 0) {
					t.Fatalf("class %d deficit %d -> %d: not whole quanta of %d", c, b, a, q)
				}
				continue
			}
			// a = b + k·q - cost for some k >= 0, or the credit saturated.
			gained := new(big.Int).SetUint64(a)
			gained.Add(gained, new(big.Int).SetUint64(it.cost))
			saturated := gained.Cmp(new(big.Int).SetUint64(math.MaxUint64)) == 0
			gained.Sub(gained, new(big.Int).SetUint64(b))
			if gained.Sign() < 0 || (!saturated && new(big.Int).Mod(gained, new(big.Int).SetUint64(q)).Sign() != 0) {
				t.Fatalf("dispatching class %d: deficit %d -> %d with cost %d, quantum %d", c, b, a, it.cost, q)
			}
		}
	default:
		t.Fatalf("Pop outcome %v", out)
	}
	return out
}

func (w *fzWorld) drain() {
	for i := len(w.live) + 1; i >= 0; i-- {
		if w.pop() == None {
			return
		}
		w.check()
	}
	w.t.Fatalf("drain did not end after %d pops", len(w.live)+2)
}

// rotate reconfigures with the class ring rotated by k.
func (w *fzWorld) rotate(k int) {
	nc := len(w.cfgs)
	before := deficits(w.s)
	cfgs := make([]ClassConfig, nc)
	for i, c := range w.cfgs {
		cfgs[(i+k)%nc] = c
	}
	if err := w.s.SetClasses(cfgs, func(it *Item) (int, Tenant) { return (int(it.Class) + k) % nc, it.Tenant() }); err != nil {
		w.t.Fatalf("SetClasses: %v", err)
	}
	after := deficits(w.s)
	n, raw, cached := make([]int, nc), make([]*big.Int, nc), make([]*big.Int, nc)
	for i := 0; i < nc; i++ {
		j := (i + k) % nc
		if after[j] != before[i] {
			w.t.Fatalf("SetClasses moved class %q deficit %d -> %d", w.cfgs[i].Name, before[i], after[j])
		}
		n[j], raw[j], cached[j] = w.n[i], w.raw[i], w.cached[i]
	}
	w.cfgs, w.n, w.raw, w.cached = cfgs, n, raw, cached
}

// check compares the scheduler with the model.
func (w *fzWorld) check() {
	t, s := w.t, w.s
	if s.Len() != len(w.live) {
		t.Fatalf("Len = %d; model has %d", s.Len(), len(w.live))
	}
	for i, st := range s.Stats() {
		if st.Name != w.cfgs[i].Name || st.Pending != uint64(w.n[i]) ||
			st.PendingRawISL != satBig(w.raw[i]) || st.PendingCached != satBig(w.cached[i]) {
			t.Fatalf("stats[%d] = %+v; model %q n=%d raw=%v cached=%v", i, st, w.cfgs[i].Name, w.n[i], w.raw[i], w.cached[i])
		}
		if st.Pending == 0 && st.Deficit != 0 {
			t.Fatalf("empty class %q holds deficit %d", st.Name, st.Deficit)
		}
	}
	var want int64
	wantOK := false
	for it := range w.live {
		if !it.Queued() {
			t.Fatalf("live item %d reports not queued", it.Seq())
		}
		if at, ok := w.expiryOf(it); ok && (!wantOK || at < want) {
			want, wantOK = at, true
		}
	}
	if at, ok := s.NextExpiry(); at != want || ok != wantOK {
		t.Fatalf("NextExpiry = %d, %v; model %d, %v", at, ok, want, wantOK)
	}
}
