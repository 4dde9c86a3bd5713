package drr

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestNewValidation(t *testing.T) {
	good := qclass("a", 1, FCFS)
	tests := []struct {
		name    string
		classes []ClassConfig
		wantErr string // substring; "" = valid
	}{
		{"one class", []ClassConfig{good}, ""},
		{"no classes", nil, "at least one"},
		{"zero quantum", []ClassConfig{good, qclass("slow", 0, FCFS)}, `"slow" (index 1): quantum must be > 0`},
		{"duplicate name", []ClassConfig{good, qclass("a", 2, WSPT)}, `"a" (index 1): name already used`},
		{"unknown policy", []ClassConfig{qclass("p", 1, Policy(9))}, `"p" (index 0): unknown queue policy`},
		{"negative budget", []ClassConfig{{Name: "n", Quantum: 1, WaitBudget: -time.Second}}, `"n" (index 0): wait budget`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(tc.classes)
			if tc.wantErr == "" {
				if err != nil || s == nil {
					t.Fatalf("New = %v, %v; want a scheduler", s, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("New error = %v; want it to contain %q", err, tc.wantErr)
			}
			// SetClasses validates the same way and leaves the scheduler alone.
			s2 := mustNew(t, good)
			enqueue(t, s2, costReq(0, 5, "x"))
			if err := s2.SetClasses(tc.classes, func(it *Item) (int, Tenant) { return 0, it.Tenant() }); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("SetClasses error = %v; want it to contain %q", err, tc.wantErr)
			}
			if s2.Len() != 1 || s2.Class(0).Name != "a" {
				t.Fatalf("after a failed SetClasses: Len %d, class %q; want 1, a", s2.Len(), s2.Class(0).Name)
			}
		})
	}
}

func TestOfferAdmission(t *testing.T) {
	direct := qclass("direct", 1, FCFS)
	direct.Queueing = false
	tests := []struct {
		name    string
		class   int
		backlog bool
		allBusy bool
		queued  bool
	}{
		{"class without threshold never queues", 1, false, true, false},
		{"no backlog, an endpoint free: direct", 0, false, false, false},
		{"no backlog, all busy: queue", 0, false, true, true},
		{"backlog, an endpoint free: queue behind it", 0, true, false, true},
		{"backlog, all busy: queue", 0, true, true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := mustNew(t, qclass("q", 1, FCFS), direct)
			if tc.backlog {
				enqueue(t, s, costReq(0, 1, "old"))
			}
			before := s.Len()
			it, err := s.Offer(costReq(tc.class, 1, "new"), Tenant{}, 1, tc.allBusy)
			if err != nil {
				t.Fatalf("Offer: %v", err)
			}
			if got := it != nil; got != tc.queued {
				t.Fatalf("queued = %v; want %v", got, tc.queued)
			}
			want := before
			if tc.queued {
				want++
			}
			if s.Len() != want {
				t.Fatalf("Len = %d; want %d", s.Len(), want)
			}
		})
	}
	s := mustNew(t, qclass("q", 1, FCFS))
	if _, err := s.Offer(costReq(3, 1, "x"), Tenant{}, 1, true); err == nil || !strings.Contains(err.Error(), "class index 3") {
		t.Fatalf("Offer with class 3 of 1: error %v; want class index out of range", err)
	}
}

func TestOfferLimits(t *testing.T) {
	type offer struct {
		raw, cached uint64
	}
	tests := []struct {
		name      string
		req, raw  uint64 // per-worker limits (cached: cach)
		cach      uint64
		endpoints int
		offers    []offer
		accepted  int // offers accepted before the first rejection
		want      *Rejection
	}{
		{
			name: "requests scale with endpoints", req: 2, raw: NoLimit, cach: NoLimit, endpoints: 3,
			offers: slices.Repeat([]offer{{1, 0}}, 7), accepted: 6,
			want: &Rejection{Class: "c", Kind: LimitRequests, Current: 6, Limit: 6},
		},
		{
			name: "same per-worker limit, one endpoint", req: 2, raw: NoLimit, cach: NoLimit, endpoints: 1,
			offers: slices.Repeat([]offer{{1, 0}}, 3), accepted: 2,
			want: &Rejection{Class: "c", Kind: LimitRequests, Current: 2, Limit: 2},
		},
		{
			name: "limit 0 always rejects", req: 0, raw: NoLimit, cach: NoLimit, endpoints: 4,
			offers: []offer{{1, 0}}, accepted: 0,
			want: &Rejection{Class: "c", Kind: LimitRequests, Current: 0, Limit: 0},
		},
		{
			name: "no endpoints: finite limits reject", req: 5, raw: NoLimit, cach: NoLimit, endpoints: 0,
			offers: []offer{{1, 0}}, accepted: 0,
			want: &Rejection{Class: "c", Kind: LimitRequests, Current: 0, Limit: 0},
		},
		{
			name: "NoLimit holds with no endpoints", req: NoLimit, raw: NoLimit, cach: NoLimit, endpoints: 0,
			offers: slices.Repeat([]offer{{1, 0}}, 5), accepted: 5,
		},
		{
			name: "raw tokens: checked before adding", req: NoLimit, raw: 1000, cach: NoLimit, endpoints: 2,
			offers: slices.Repeat([]offer{{600, 0}}, 5), accepted: 4,
			want: &Rejection{Class: "c", Kind: LimitRawISLTokens, Current: 2400, Limit: 2000},
		},
		{
			name: "cached tokens are clamped to raw", req: NoLimit, raw: NoLimit, cach: 70, endpoints: 1,
			offers: []offer{{60, 500}, {10, 10}, {1, 0}}, accepted: 2,
			want: &Rejection{Class: "c", Kind: LimitCachedTokens, Current: 70, Limit: 70},
		},
		{
			name: "requests are checked first", req: 1, raw: 1, cach: 1, endpoints: 1,
			offers: []offer{{5, 5}, {5, 5}}, accepted: 1,
			want: &Rejection{Class: "c", Kind: LimitRequests, Current: 1, Limit: 1},
		},
		{
			name: "raw before cached", req: NoLimit, raw: 1, cach: 1, endpoints: 1,
			offers: []offer{{5, 5}, {5, 5}}, accepted: 1,
			want: &Rejection{Class: "c", Kind: LimitRawISLTokens, Current: 5, Limit: 1},
		},
		{
			name: "limit saturates instead of overflowing", req: NoLimit, raw: math.MaxUint64/2 + 1, cach: NoLimit, endpoints: 3,
			offers: []offer{{math.MaxUint64, 0}, {math.MaxUint64, 0}}, accepted: 1,
			want: &Rejection{Class: "c", Kind: LimitRawISLTokens, Current: math.MaxUint64, Limit: math.MaxUint64},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := qclass("c", 1, FCFS)
			cfg.RequestLimitPerWorker, cfg.RawISLLimitPerWorker, cfg.CachedLimitPerWorker = tc.req, tc.raw, tc.cach
			s := mustNew(t, cfg)
			accepted := 0
			var rej *Rejection
			for i, o := range tc.offers {
				it, err := s.Offer(Request{Pinned: NoEndpoint, RawISL: o.raw, Cached: o.cached}, Tenant{}, tc.endpoints, true)
				if err != nil {
					if !errors.As(err, &rej) {
						t.Fatalf("offer %d: error %v is not a *Rejection", i, err)
					}
					break
				}
				if it == nil {
					t.Fatalf("offer %d: dispatched directly; want queued", i)
				}
				accepted++
			}
			if accepted != tc.accepted {
				t.Fatalf("accepted %d offers; want %d", accepted, tc.accepted)
			}
			if tc.want == nil {
				if rej != nil {
					t.Fatalf("rejected: %v; want none", rej)
				}
				return
			}
			if rej == nil || *rej != *tc.want {
				t.Fatalf("rejection = %+v; want %+v", rej, tc.want)
			}
			if s.Len() != tc.accepted {
				t.Fatalf("Len = %d after a rejection; want %d", s.Len(), tc.accepted)
			}
		})
	}
}

// TestOneToThreePattern: quanta 1 and 3 with equal costs serve one request
// of the first class per three of the second (SPEC §11).
func TestOneToThreePattern(t *testing.T) {
	for _, cost := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprintf("cost %d", cost), func(t *testing.T) {
			s := mustNew(t, qclass("one", 1, FCFS), qclass("three", 3, FCFS))
			for i := 0; i < 60; i++ {
				enqueue(t, s, costReq(0, cost, "one"))
				enqueue(t, s, costReq(1, cost, "three"))
			}
			p := newProbe()
			var got []string
			for i := 0; i < 60; i++ {
				got = append(got, popLabel(t, s, 0, p))
			}
			if cost == 1 {
				// From the start: the cursor class earns 1 and pays 1, then
				// "three" earns 3 and spends it in one burst.
				want := slices.Repeat([]string{"one", "three", "three", "three"}, 15)
				if !slices.Equal(got, want) {
					t.Fatalf("pops = %v\nwant   %v", got, want)
				}
			}
			for w := 0; w+4 <= len(got); w += 4 {
				ones := 0
				for _, l := range got[w : w+4] {
					if l == "one" {
						ones++
					}
				}
				if ones != 1 {
					t.Fatalf("pops %d..%d = %v; want one \"one\" and three \"three\"", w, w+3, got[w:w+4])
				}
			}
		})
	}
}

// TestWorkedExampleBurst: quantum 10, costs 3,3,3,3 dispatches three, then
// moves on keeping deficit 1 (SPEC §4).
func TestWorkedExampleBurst(t *testing.T) {
	s := mustNew(t, qclass("burst", 10, FCFS), qclass("other", 10, FCFS))
	for i := 0; i < 4; i++ {
		enqueue(t, s, costReq(0, 3, fmt.Sprintf("b%d", i)))
	}
	enqueue(t, s, costReq(1, 3, "o0"))
	p := newProbe()
	wantDef := []uint64{7, 4, 1}
	for i := 0; i < 3; i++ {
		if l := popLabel(t, s, 0, p); l != fmt.Sprintf("b%d", i) {
			t.Fatalf("pop %d = %q; want b%d", i, l, i)
		}
		if d := deficits(s)[0]; d != wantDef[i] {
			t.Fatalf("deficit after pop %d = %d; want %d", i, d, wantDef[i])
		}
		wantCursor := 0
		if i == 2 {
			wantCursor = 1
		}
		if s.cursor != wantCursor {
			t.Fatalf("cursor after pop %d = %d; want %d", i, s.cursor, wantCursor)
		}
	}
	if l := popLabel(t, s, 0, p); l != "o0" {
		t.Fatalf("fourth pop = %q; want the other class (o0)", l)
	}
	if d := deficits(s); d[0] != 1 {
		t.Fatalf("burst deficit = %d; want 1 kept", d[0])
	}
}

// TestWorkedExampleBulk: standard q=1000 head 7000, latency q=2000 head
// 9000 fast-forward 4 rounds; latency dispatches keeping 1000 (SPEC §4).
// With latency first in the ring, standard comes after the dispatcher in
// the last round and earns that round at its next visit instead, exactly
// as round-by-round DRR would.
func TestWorkedExampleBulk(t *testing.T) {
	tests := []struct {
		name       string
		latencyIdx int
		wantDef    [2]uint64 // standard, latency after the first pop
		wantCursor int
		wantLat2   uint64 // latency's deficit once s0 has gone second
	}{
		{"standard first", 1, [2]uint64{5000, 1000}, 0, 3000},
		{"latency first", 0, [2]uint64{4000, 1000}, 1, 5000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			std := 1 - tc.latencyIdx
			cfgs := make([]ClassConfig, 2)
			cfgs[std] = qclass("standard", 1000, FCFS)
			cfgs[tc.latencyIdx] = qclass("latency", 2000, FCFS)
			s := mustNew(t, cfgs...)
			enqueue(t, s, costReq(std, 7000, "s0"))
			enqueue(t, s, costReq(tc.latencyIdx, 9000, "l0"))
			enqueue(t, s, costReq(tc.latencyIdx, 9000, "l1"))
			p := newProbe()
			if l := popLabel(t, s, 0, p); l != "l0" {
				t.Fatalf("pop = %q; want l0", l)
			}
			d := deficits(s)
			if got := [2]uint64{d[std], d[tc.latencyIdx]}; got != tc.wantDef {
				t.Fatalf("deficits (standard, latency) = %v; want %v", got, tc.wantDef)
			}
			if s.cursor != tc.wantCursor {
				t.Fatalf("cursor = %d; want %d (latency cannot afford its next head)", s.cursor, tc.wantCursor)
			}
			if p.sharedCalls != 2 {
				t.Fatalf("shared probes = %d; want 2 (one per class, the rescan reuses them)", p.sharedCalls)
			}
			// Both orders reach the same grants per class: s0 goes next.
			if l := popLabel(t, s, 0, p); l != "s0" {
				t.Fatalf("second pop = %q; want s0", l)
			}
			if d := deficits(s); d[std] != 0 || d[tc.latencyIdx] != tc.wantLat2 {
				t.Fatalf("deficits after s0 = %v; want standard 0, latency %d", d, tc.wantLat2)
			}
		})
	}
}

// TestBlockedRingAccruesNothing: a fully blocked ring polled 10,000 times
// earns no credit and keeps what it had (SPEC §11).
func TestBlockedRingAccruesNothing(t *testing.T) {
	s := mustNew(t, qclass("a", 10, FCFS), qclass("b", 7, WSPT), qclass("c", 1, EDF))
	enqueue(t, s, costReq(0, 3, "a0"))
	enqueue(t, s, costReq(0, 3, "a1"))
	enqueue(t, s, Request{Class: 1, Pinned: 4, RawISL: 50, Payload: "b0"})
	enqueue(t, s, costReq(2, 1, "c0"))
	p := newProbe()
	if l := popLabel(t, s, 0, p); l != "a0" {
		t.Fatalf("first pop = %q; want a0", l)
	}
	p.shared = Blocked
	p.lanes[4] = Blocked
	want := deficits(s) // [7 0 0]
	for i := 0; i < 10_000; i++ {
		if it, out := s.Pop(int64(i), p); out != None || it != nil {
			t.Fatalf("poll %d = %v, %v; want None", i, it, out)
		}
	}
	if got := deficits(s); !slices.Equal(got, want) || got[0] != 7 {
		t.Fatalf("deficits after 10,000 blocked polls = %v; want %v", got, want)
	}
	if p.laneCalls != 1 {
		t.Fatalf("lane probes = %d; want 1 (the blocked lane is parked)", p.laneCalls)
	}
}

// TestOversizedHead: a head costing many quanta dispatches in one call.
func TestOversizedHead(t *testing.T) {
	tests := []struct {
		quantum, cost uint64
	}{
		{4, 100}, // 25× the quantum
		{1, 1_000_000_000},
		{3, math.MaxUint64},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("q%d cost %d", tc.quantum, tc.cost), func(t *testing.T) {
			s := mustNew(t, qclass("big", tc.quantum, FCFS), qclass("idle", 1, FCFS))
			enqueue(t, s, costReq(0, tc.cost, "big"))
			enqueue(t, s, costReq(0, tc.cost, "big2"))
			if l := popLabel(t, s, 0, newProbe()); l != "big" {
				t.Fatalf("pop = %q; want big in one call", l)
			}
			if d := deficits(s)[0]; d >= tc.quantum {
				t.Fatalf("deficit left = %d; want < quantum %d (whole rounds only)", d, tc.quantum)
			}
		})
	}
}

// TestLaneProbedOncePerLane: with 10,000 exact lanes, half blocked, one
// drain probes each lane exactly once and dispatches exactly the ready half
// (SPEC §11).
func TestLaneProbedOncePerLane(t *testing.T) {
	const lanes = 10_000
	s := mustNew(t, qclass("c", 100, FCFS))
	p := newProbe()
	for ep := EndpointID(0); ep < lanes; ep++ {
		v := Ready
		if ep%2 == 1 {
			v = Blocked
		}
		p.lanes[ep+1] = v
		// Two requests per lane: the second must be dispatched on the
		// cached verdict.
		for j := 0; j < 2; j++ {
			enqueue(t, s, Request{Pinned: ep + 1, RawISL: 10, Arrival: int64(j*lanes) + int64(ep), Payload: fmt.Sprint(ep)})
		}
	}
	got := drainLabels(t, s, 0, p)
	if p.laneCalls != lanes {
		t.Fatalf("lane probes = %d; want %d (one per lane)", p.laneCalls, lanes)
	}
	for ep, n := range p.laneCallsBy {
		if n != 1 {
			t.Fatalf("lane %d probed %d times; want 1", ep, n)
		}
	}
	if len(got) != lanes {
		t.Fatalf("dispatched %d; want %d (both requests of each ready lane)", len(got), lanes)
	}
	for _, l := range got {
		var ep int
		fmt.Sscan(l, &ep)
		if ep%2 == 1 {
			t.Fatalf("dispatched from blocked lane %d", ep)
		}
	}
	// A second drain with no endpoint change probes nothing.
	if l := popLabel(t, s, 0, p); l != "" || p.laneCalls != lanes {
		t.Fatalf("second drain: pop %q, lane probes %d; want nothing and %d", l, p.laneCalls, lanes)
	}
}

// TestLaneHeadOfLineIsLocal: a blocked exact lane blocks neither another
// lane nor the shared heap, and a blocked shared head blocks no lane.
func TestLaneHeadOfLineIsLocal(t *testing.T) {
	build := func() *Scheduler {
		s := mustNew(t, qclass("c", 1000, FCFS))
		// The blocked lane holds the best keys of the class.
		enqueue(t, s, Request{Pinned: 1, RawISL: 1, StrictPriority: 9, Arrival: 0, Payload: "blocked0"})
		enqueue(t, s, Request{Pinned: 1, RawISL: 1, StrictPriority: 9, Arrival: 1, Payload: "blocked1"})
		enqueue(t, s, Request{Pinned: 2, RawISL: 1, Arrival: 2, Payload: "lane2"})
		enqueue(t, s, Request{Pinned: NoEndpoint, RawISL: 1, Arrival: 3, Payload: "shared0"})
		enqueue(t, s, Request{Pinned: 2, RawISL: 1, Arrival: 4, Payload: "lane2b"})
		enqueue(t, s, Request{Pinned: NoEndpoint, RawISL: 1, Arrival: 5, Payload: "shared1"})
		return s
	}
	tests := []struct {
		name   string
		shared Verdict
		lanes  map[EndpointID]Verdict
		want   []string
	}{
		{"blocked lane", Ready, map[EndpointID]Verdict{1: Blocked, 2: Ready}, []string{"lane2", "shared0", "lane2b", "shared1"}},
		{"blocked shared head", Blocked, map[EndpointID]Verdict{1: Ready, 2: Ready}, []string{"blocked0", "blocked1", "lane2", "lane2b"}},
		{"only the shared heap free", Ready, map[EndpointID]Verdict{1: Blocked, 2: Blocked}, []string{"shared0", "shared1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := build()
			p := newProbe()
			p.shared, p.lanes = tc.shared, tc.lanes
			if got := drainLabels(t, s, 0, p); !slices.Equal(got, tc.want) {
				t.Fatalf("drain = %v; want %v", got, tc.want)
			}
		})
	}
}

func TestOrdering(t *testing.T) {
	const sec = int64(time.Second)
	tests := []struct {
		name   string
		policy Policy
		budget time.Duration
		reqs   []Request // Payload is the label
		want   []string
	}{
		{"strict tier first", FCFS, 0, []Request{
			{RawISL: 1, Arrival: 1, Payload: "t0"},
			{RawISL: 1, Arrival: 3, StrictPriority: 2, Payload: "t2"},
			{RawISL: 1, Arrival: 2, StrictPriority: 1, Priority: 100, Payload: "t1"},
		}, []string{"t2", "t1", "t0"}},
		{"due before no due, earlier first", FCFS, 0, []Request{
			{RawISL: 1, Arrival: 1, Payload: "none"},
			{RawISL: 1, Arrival: 2, Due: 100, Payload: "due100"},
			{RawISL: 1, Arrival: 3, Due: 50, Payload: "due50"},
		}, []string{"due50", "due100", "none"}},
		{"fcfs priority is seconds of earlier arrival", FCFS, 0, []Request{
			{RawISL: 1, Arrival: 0, Payload: "a0"},
			{RawISL: 1, Arrival: sec * 9 / 10, Priority: 1, Payload: "bumped"},   // effective -0.1 s
			{RawISL: 1, Arrival: sec * 25 / 10, Priority: 2, Payload: "late"},    // effective 0.5 s
			{RawISL: 1, Arrival: sec * 11 / 10, Priority: 1, Payload: "tooLate"}, // effective 0.1 s
		}, []string{"bumped", "a0", "tooLate", "late"}},
		{"fcfs negative priority is clamped, not pushed back", FCFS, 0, []Request{
			{RawISL: 1, Arrival: 0, Priority: -5, Payload: "neg"},
			{RawISL: 1, Arrival: 1, Payload: "zero"},
		}, []string{"neg", "zero"}},
		{"fcfs ties on effective arrival keep sequence", FCFS, 0, []Request{
			{RawISL: 1, Arrival: sec, Priority: 1, Payload: "first"},
			{RawISL: 1, Arrival: 0, Payload: "second"},
		}, []string{"first", "second"}},
		{"fcfs ignores the wait budget as a due time", FCFS, time.Hour, []Request{
			{RawISL: 1, Arrival: 2, Payload: "a"},
			{RawISL: 1, Arrival: 1, Payload: "b"},
		}, []string{"b", "a"}},
		{"wspt: (1+priority)/cost, higher first", WSPT, 0, []Request{
			{RawISL: 100, Arrival: 0, Payload: "c100"},
			{RawISL: 50, Arrival: 1, Payload: "c50"},
			{RawISL: 300, Arrival: 2, Priority: 2, Payload: "c300p2"}, // 3/300 ties c100
			{RawISL: 10, Arrival: 3, Priority: -7, Payload: "c10neg"}, // clamped: 1/10
			{RawISL: 200, Cached: 190, Arrival: 4, Payload: "cached"}, // cost 10, ties c10neg
		}, []string{"c10neg", "cached", "c50", "c100", "c300p2"}},
		{"wspt is exact for huge costs", WSPT, 0, []Request{
			{RawISL: math.MaxUint64, Arrival: 0, Payload: "max"},
			{RawISL: math.MaxUint64 - 1, Arrival: 1, Payload: "max-1"},
		}, []string{"max-1", "max"}},
		{"edf ignores priority and strict priority", EDF, 0, []Request{
			{RawISL: 1, Arrival: 0, Due: 300, StrictPriority: 5, Priority: 9, Payload: "d300"},
			{RawISL: 1, Arrival: 1, Due: 200, Payload: "d200"},
			{RawISL: 1, Arrival: 2, Priority: 50, Payload: "noDue2"},
			{RawISL: 1, Arrival: 1, StrictPriority: 3, Payload: "noDue1"},
		}, []string{"d200", "d300", "noDue1", "noDue2"}},
		{"edf gives a request without deadline arrival+budget", EDF, 150, []Request{
			{RawISL: 1, Arrival: 0, Due: 300, Payload: "d300"},
			{RawISL: 1, Arrival: 100, Payload: "auto250"},
			{RawISL: 1, Arrival: 0, Payload: "auto150"},
			{RawISL: 1, Arrival: 1, Due: 200, Payload: "d200"},
		}, []string{"auto150", "d200", "auto250", "d300"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := qclass("c", math.MaxUint64, tc.policy)
			cfg.WaitBudget = tc.budget
			s := mustNew(t, cfg)
			for _, r := range tc.reqs {
				enqueue(t, s, r)
			}
			if got := drainLabels(t, s, math.MinInt64, newProbe()); !slices.Equal(got, tc.want) {
				t.Fatalf("order = %v; want %v", got, tc.want)
			}
		})
	}
}

// TestPolicyIsPerClass: fcfs and wspt order only inside their own class;
// which class goes next is DRR's business alone.
func TestPolicyIsPerClass(t *testing.T) {
	const sec = int64(time.Second)
	s := mustNew(t, qclass("fcfs", 10, FCFS), qclass("wspt", 10, WSPT))
	// The wspt class's requests all arrive first and carry higher
	// priorities; they still only take their DRR turns.
	enqueue(t, s, Request{Class: 1, RawISL: 10, Arrival: 0, Payload: "w-p0"})
	enqueue(t, s, Request{Class: 1, RawISL: 10, Arrival: 1, Priority: 4, Payload: "w-p4"})
	enqueue(t, s, Request{Class: 1, RawISL: 10, Arrival: 2, Priority: 1, Payload: "w-p1"})
	enqueue(t, s, Request{Class: 0, RawISL: 10, Arrival: 10 * sec, Payload: "f-10s"})
	enqueue(t, s, Request{Class: 0, RawISL: 10, Arrival: 11 * sec, Priority: 5, Payload: "f-6s"})
	enqueue(t, s, Request{Class: 0, RawISL: 10, Arrival: 12 * sec, Payload: "f-12s"})
	want := []string{"f-6s", "w-p4", "f-10s", "w-p1", "f-12s", "w-p0"}
	if got := drainLabels(t, s, 0, newProbe()); !slices.Equal(got, want) {
		t.Fatalf("order = %v; want %v", got, want)
	}
}

// TestRemoveAccounting: every item leaves once, and the sums return to 0.
func TestRemoveAccounting(t *testing.T) {
	a := qclass("a", 5, FCFS)
	a.WaitBudget = time.Second
	s := mustNew(t, a, qclass("b", 5, WSPT))
	var items []*Item
	for i := 0; i < 40; i++ {
		pin := NoEndpoint
		if i%3 == 0 {
			pin = EndpointID(i%4 + 1)
		}
		items = append(items, enqueue(t, s, Request{Class: int32(i % 2), Pinned: pin, RawISL: uint64(10 + i), Cached: uint64(i), Arrival: int64(40 - i)}))
	}
	st := s.Stats()
	var raw, cached uint64
	for _, it := range items {
		raw += it.RawISL
		cached += it.Cached
	}
	if got := st[0].PendingRawISL + st[1].PendingRawISL; got != raw {
		t.Fatalf("pending raw = %d; want %d", got, raw)
	}
	if got := st[0].PendingCached + st[1].PendingCached; got != cached {
		t.Fatalf("pending cached = %d; want %d", got, cached)
	}
	// Pop a few (they must then refuse Remove), remove the rest in a
	// scrambled order.
	popped := map[*Item]bool{}
	for i := 0; i < 5; i++ {
		it, out := s.Pop(0, newProbe())
		if out != Dispatch {
			t.Fatalf("pop %d outcome %v; want Dispatch", i, out)
		}
		popped[it] = true
	}
	for i := 0; i < len(items); i++ {
		it := items[(i*17)%len(items)]
		if got := s.Remove(it); got == popped[it] {
			t.Fatalf("Remove(item %d) = %v; popped %v", it.Seq(), got, popped[it])
		}
		if s.Remove(it) {
			t.Fatalf("second Remove(item %d) = true; want false", it.Seq())
		}
		if it.Queued() {
			t.Fatalf("item %d still Queued after Remove", it.Seq())
		}
	}
	if s.Remove(nil) {
		t.Fatal("Remove(nil) = true")
	}
	if s.Len() != 0 {
		t.Fatalf("Len = %d; want 0", s.Len())
	}
	for _, c := range s.Stats() {
		if c.Pending != 0 || c.PendingRawISL != 0 || c.PendingCached != 0 || c.Deficit != 0 {
			t.Fatalf("stats %+v; want all zero", c)
		}
	}
	if _, ok := s.NextExpiry(); ok {
		t.Fatal("NextExpiry ok with an empty queue")
	}
	if it, out := s.Pop(math.MaxInt64, newProbe()); it != nil || out != None {
		t.Fatalf("Pop on empty = %v, %v", it, out)
	}
}

// TestExpiry: expired items leave first, earliest first, without charging
// deficit or moving the cursor.
func TestExpiry(t *testing.T) {
	a := qclass("a", 10, FCFS)
	a.WaitBudget = 100
	b := qclass("b", 10, FCFS)
	b.WaitBudget = 1000
	s := mustNew(t, a, b)
	enqueue(t, s, Request{Class: 0, RawISL: 3, Arrival: 0, Payload: "a1"})
	enqueue(t, s, Request{Class: 0, RawISL: 3, Arrival: 10, Payload: "a2"})
	enqueue(t, s, Request{Class: 0, RawISL: 3, Arrival: 20, Payload: "a3"})
	enqueue(t, s, Request{Class: 0, RawISL: 3, Arrival: 200, Payload: "a4"})
	enqueue(t, s, Request{Class: 1, RawISL: 3, Arrival: -950, Payload: "b1"}) // expires at 50
	// Arrivals out of order: a5 sorts before a4 in the expiry list.
	enqueue(t, s, Request{Class: 0, RawISL: 3, Arrival: 150, Payload: "a5"})
	if at, ok := s.NextExpiry(); !ok || at != 50 {
		t.Fatalf("NextExpiry = %d, %v; want 50", at, ok)
	}
	p := newProbe()
	if l := popLabel(t, s, 0, p); l != "a1" {
		t.Fatalf("pop = %q; want a1", l)
	}
	if s.cursor != 0 || deficits(s)[0] != 7 {
		t.Fatalf("cursor %d deficit %v; want 0 and 7", s.cursor, deficits(s))
	}
	wantExpired := []string{"b1", "a2"} // expiries 50, 110
	for _, want := range wantExpired {
		it, out := s.Pop(115, p)
		if out != Expired || it.Payload != want {
			t.Fatalf("Pop(115) = %v, %v; want %s Expired", it, out, want)
		}
		if it.Queued() {
			t.Fatal("expired item still queued")
		}
		if s.cursor != 0 || deficits(s)[0] != 7 {
			t.Fatalf("after expiry: cursor %d deficits %v; want 0 and [7 0]", s.cursor, deficits(s))
		}
	}
	if at, ok := s.NextExpiry(); !ok || at != 120 {
		t.Fatalf("NextExpiry = %d, %v; want 120 (a3)", at, ok)
	}
	if l := popLabel(t, s, 115, p); l != "a3" {
		t.Fatalf("pop = %q; want a3 dispatched (not expired at 115)", l)
	}
	if at, ok := s.NextExpiry(); !ok || at != 250 {
		t.Fatalf("NextExpiry = %d, %v; want 250 (a5 arrived out of order)", at, ok)
	}
	it, out := s.Pop(1000, p)
	if out != Expired || it.Payload != "a5" {
		t.Fatalf("Pop(1000) = %v, %v; want a5 Expired", it, out)
	}
	if it, out = s.Pop(1000, p); out != Expired || it.Payload != "a4" {
		t.Fatalf("Pop(1000) = %v, %v; want a4 Expired", it, out)
	}
	if s.Len() != 0 || deficits(s)[0] != 0 {
		t.Fatalf("Len %d deficits %v; want empty with the emptied class reset", s.Len(), deficits(s))
	}
}

// TestUnroutable: an unroutable head leaves with NoRoute, without charging
// deficit or moving the cursor, and the scan that found it leaves no credit
// behind.
func TestUnroutable(t *testing.T) {
	for _, pinned := range []bool{false, true} {
		t.Run(fmt.Sprintf("pinned=%v", pinned), func(t *testing.T) {
			s := mustNew(t, qclass("a", 10, FCFS), qclass("b", 10, FCFS))
			enqueue(t, s, costReq(0, 3, "a0"))
			enqueue(t, s, costReq(0, 50, "a-big")) // unaffordable: the scan adds credit
			bad := Request{Class: 1, Pinned: NoEndpoint, RawISL: 1, Payload: "gone"}
			if pinned {
				bad.Pinned = 7
			}
			enqueue(t, s, bad)
			enqueue(t, s, costReq(1, 1, "b1"))
			p := newProbe()
			if l := popLabel(t, s, 0, p); l != "a0" {
				t.Fatalf("pop = %q; want a0", l)
			}
			before, cursor := deficits(s), s.cursor
			p.sharedFn = func(class int, it *Item) Verdict {
				if it.Payload == "gone" {
					return Unroutable
				}
				return Ready
			}
			p.lanes[7] = Unroutable
			it, out := s.Pop(0, p)
			if out != NoRoute || it.Payload != "gone" {
				t.Fatalf("Pop = %v, %v; want gone NoRoute", it, out)
			}
			if got := deficits(s); !slices.Equal(got, before) || s.cursor != cursor {
				t.Fatalf("deficits %v cursor %d; want %v and %d unchanged", got, s.cursor, before, cursor)
			}
			if s.Remove(it) {
				t.Fatal("Remove after NoRoute = true")
			}
		})
	}
}

// TestEndpointChangedRechecksBlockedLane: a blocked lane is asked once, then
// again only after its endpoint changes.
func TestEndpointChangedRechecksBlockedLane(t *testing.T) {
	s := mustNew(t, qclass("a", 10, FCFS), qclass("b", 10, FCFS))
	enqueue(t, s, Request{Class: 0, Pinned: 1, RawISL: 1, Payload: "a"})
	enqueue(t, s, Request{Class: 1, Pinned: 1, RawISL: 1, Payload: "b"})
	enqueue(t, s, Request{Class: 1, Pinned: 2, RawISL: 1, Payload: "other"})
	p := newProbe()
	p.lanes[1], p.lanes[2] = Blocked, Blocked
	for i := 0; i < 3; i++ {
		if l := popLabel(t, s, 0, p); l != "" {
			t.Fatalf("pop = %q; want nothing", l)
		}
	}
	if p.laneCallsBy[1] != 2 || p.laneCallsBy[2] != 1 {
		t.Fatalf("probes %v; want ep1 twice (two classes), ep2 once", p.laneCallsBy)
	}
	p.lanes[1] = Ready // not reported yet: the cached verdict stands
	if l := popLabel(t, s, 0, p); l != "" {
		t.Fatalf("pop before EndpointChanged = %q; want nothing", l)
	}
	s.EndpointChanged(1)
	s.EndpointChanged(99) // unknown endpoint: no effect
	if got := drainLabels(t, s, 0, p); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("drain = %v; want [a b]", got)
	}
	if p.laneCallsBy[1] != 4 || p.laneCallsBy[2] != 1 {
		t.Fatalf("probes %v; want ep1 four times, ep2 still once", p.laneCallsBy)
	}
}

// TestReadyVerdictCachedUntilChange: a Ready lane is not asked again for
// its next head until its endpoint changes.
func TestReadyVerdictCachedUntilChange(t *testing.T) {
	s := mustNew(t, qclass("a", 100, FCFS))
	for i := 0; i < 3; i++ {
		enqueue(t, s, Request{Pinned: 5, RawISL: 1, Arrival: int64(i), Payload: fmt.Sprint(i)})
	}
	p := newProbe()
	p.lanes[5] = Ready
	popLabel(t, s, 0, p)
	popLabel(t, s, 0, p)
	if p.laneCalls != 1 {
		t.Fatalf("lane probes = %d; want 1", p.laneCalls)
	}
	p.lanes[5] = Blocked
	s.EndpointChanged(5)
	if l := popLabel(t, s, 0, p); l != "" || p.laneCalls != 2 {
		t.Fatalf("pop %q, probes %d; want nothing after the change, 2 probes", l, p.laneCalls)
	}
}

// TestSetClasses: reconfiguring keeps every item, its order and the
// deficits of surviving names.
func TestSetClasses(t *testing.T) {
	s := mustNew(t, qclass("a", 10, FCFS), qclass("b", 10, FCFS))
	for i := 0; i < 4; i++ {
		enqueue(t, s, Request{Class: 0, RawISL: 3, Arrival: int64(i), Payload: fmt.Sprintf("a%d", i)})
		enqueue(t, s, Request{Class: 1, Pinned: EndpointID(i%2 + 1), RawISL: 4, Arrival: int64(i), Payload: fmt.Sprintf("b%d", i)})
	}
	p := newProbe()
	if l := popLabel(t, s, 0, p); l != "a0" {
		t.Fatalf("pop = %q; want a0", l)
	}
	if s.cursor != 0 || deficits(s)[0] != 7 {
		t.Fatalf("cursor %d deficits %v", s.cursor, deficits(s))
	}
	name := map[int]string{0: "a", 1: "b"}
	newCfg := []ClassConfig{qclass("new", 1, FCFS), qclass("b", 10, FCFS), qclass("a", 10, FCFS)}
	if err := s.SetClasses(newCfg, func(it *Item) (int, Tenant) { return 3, it.Tenant() }); err == nil || !strings.Contains(err.Error(), "index 3") {
		t.Fatalf("SetClasses with index 3 = %v; want out of range", err)
	}
	if s.Len() != 7 || s.NumClasses() != 2 {
		t.Fatalf("failed SetClasses changed the scheduler: Len %d classes %d", s.Len(), s.NumClasses())
	}
	if err := s.SetClasses(newCfg, func(it *Item) (int, Tenant) { return map[string]int{"a": 2, "b": 1}[name[int(it.Class)]], it.Tenant() }); err != nil {
		t.Fatalf("SetClasses: %v", err)
	}
	if s.cursor != 2 {
		t.Fatalf("cursor = %d; want 2 (class a kept it)", s.cursor)
	}
	st := s.Stats()
	if st[2].Name != "a" || st[2].Deficit != 7 || st[2].Pending != 3 || st[1].Pending != 4 || st[0].Pending != 0 {
		t.Fatalf("stats after SetClasses = %+v", st)
	}
	got := drainLabels(t, s, 0, p)
	var gotA, gotB []string
	for _, l := range got {
		if l[0] == 'a' {
			gotA = append(gotA, l)
		} else {
			gotB = append(gotB, l)
		}
	}
	if !slices.Equal(gotA, []string{"a1", "a2", "a3"}) || !slices.Equal(gotB, []string{"b0", "b1", "b2", "b3"}) {
		t.Fatalf("order after SetClasses = %v", got)
	}
	if got[0] != "a1" {
		t.Fatalf("first pop after SetClasses = %q; want a1 (class a keeps cursor and deficit 7)", got[0])
	}

	// Merging two classes interleaves them by arrival, ties by sequence.
	s = mustNew(t, qclass("x", 10, FCFS), qclass("y", 10, FCFS))
	var items []*Item
	for i := 0; i < 3; i++ {
		items = append(items, enqueue(t, s, Request{Class: 1, RawISL: 1, Arrival: int64(i), Payload: fmt.Sprintf("y%d", i)}))
		items = append(items, enqueue(t, s, Request{Class: 0, RawISL: 1, Arrival: int64(i), Payload: fmt.Sprintf("x%d", i)}))
	}
	if err := s.SetClasses([]ClassConfig{qclass("merged", 10, FCFS)}, func(it *Item) (int, Tenant) { return 0, it.Tenant() }); err != nil {
		t.Fatalf("SetClasses: %v", err)
	}
	for _, it := range items {
		if it.Class != 0 || !it.Queued() {
			t.Fatalf("item %v: class %d queued %v; want class 0, queued", it.Payload, it.Class, it.Queued())
		}
	}
	want := []string{"y0", "x0", "y1", "x1", "y2", "x2"}
	if got := drainLabels(t, s, 0, p); !slices.Equal(got, want) {
		t.Fatalf("merged order = %v; want %v", got, want)
	}
}

// TestStatsSaturate: token sums saturate in Stats but stay exact inside.
func TestStatsSaturate(t *testing.T) {
	s := mustNew(t, qclass("c", 1, FCFS))
	a := enqueue(t, s, Request{RawISL: math.MaxUint64, Cached: math.MaxUint64})
	enqueue(t, s, Request{RawISL: 5, Cached: 2})
	if st := s.Stats()[0]; st.PendingRawISL != math.MaxUint64 || st.PendingCached != math.MaxUint64 {
		t.Fatalf("stats %+v; want saturated sums", st)
	}
	s.Remove(a)
	if st := s.Stats()[0]; st.PendingRawISL != 5 || st.PendingCached != 2 || st.Pending != 1 {
		t.Fatalf("stats %+v; want exact sums 5 and 2 after removing the giant", st)
	}
}
