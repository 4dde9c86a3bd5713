package autothreshold

import (
	"testing"
	"time"
)

const ms = int64(time.Millisecond)

// feed observes one sample every 100 ms from t0 until a decision (five
// scrapes: 0, 100, ..., 500 ms) and returns the last move.
func feed(c *Controller, t0 int64, s Sample) (Move, int64) {
	var m Move
	at := t0
	for i := 0; i < 6; i++ {
		s.At = at
		m = c.Observe(s)
		at += 100 * ms
		if m != Hold {
			break
		}
	}
	return m, at
}

func TestRule(t *testing.T) {
	tests := []struct {
		name   string
		budget uint64
		start  uint64 // threshold before the window (0: the start value)
		s      Sample
		move   Move
		want   uint64
	}{
		{name: "starts at 7/8 of the step budget, holds in the band",
			budget: 8192, s: Sample{Waiting: 2, HasWaiting: true, Load: 9000, MeanPrompt: 512, Held: true},
			move: Hold, want: 7168},
		{name: "below the start, a starved engine: raise by T/8",
			budget: 8192, start: 4096, s: Sample{Waiting: 0, HasWaiting: true, Running: 8, HasRunning: true, Load: 4096, MeanPrompt: 512, Held: true},
			move: Raise, want: 4096 + 512},
		{name: "a raise below the start stops at the start",
			budget: 8192, start: 7000, s: Sample{Waiting: 0, HasWaiting: true, Running: 8, HasRunning: true, Load: 7000, MeanPrompt: 512, Held: true},
			move: Raise, want: 7168},
		{name: "at the start, an engine that is busy but queues nothing: hold",
			budget: 8192, s: Sample{Waiting: 0, HasWaiting: true, Running: 16, HasRunning: true, Load: 7168, MeanPrompt: 512, Held: true},
			move: Hold, want: 7168},
		{name: "at the start, an idle engine with work held: raise",
			budget: 8192, s: Sample{Waiting: 0, HasWaiting: true, Running: 0, HasRunning: true, Load: 7168, MeanPrompt: 512, Held: true},
			move: Raise, want: 7168 + 896},
		{name: "an idle engine without a running count is not idle",
			budget: 8192, s: Sample{Waiting: 0, HasWaiting: true, Load: 7168, MeanPrompt: 512, Held: true},
			move: Hold, want: 7168},
		{name: "raise is at most half the band",
			budget: 8192, start: 30000, s: Sample{Waiting: 0, HasWaiting: true, HasRunning: true, Load: 30000, MeanPrompt: 512, Held: true},
			move: Raise, want: 30000 + 1024},
		{name: "raise is at least one prompt",
			budget: 8192, start: 600, s: Sample{Waiting: 0, HasWaiting: true, Load: 600, MeanPrompt: 512, Held: true},
			move: Raise, want: 600 + 512},
		{name: "raise stops at the ceiling",
			budget: 8192, start: 4*8192 - 100, s: Sample{Waiting: 0, HasWaiting: true, HasRunning: true, Load: 32000, MeanPrompt: 512, Held: true},
			move: Raise, want: 4 * 8192},
		{name: "engine empty but nothing held: hold",
			budget: 8192, s: Sample{Waiting: 0, HasWaiting: true, HasRunning: true, Load: 100, MeanPrompt: 512},
			move: Hold, want: 7168},
		{name: "queue over the band: lower to the intake plus one prompt",
			budget: 8192, s: Sample{Waiting: 12, HasWaiting: true, Load: 16 * 512, MeanPrompt: 512, Held: true},
			move: Lower, want: 4*512 + 512},
		{name: "lower stops at the floor",
			budget: 8192, s: Sample{Waiting: 100, HasWaiting: true, Load: 0, MeanPrompt: 100},
			move: Lower, want: 512},
		{name: "lower is at least one prompt",
			budget: 8192, start: 3000, s: Sample{Waiting: 6, HasWaiting: true, Load: 100000, MeanPrompt: 512},
			move: Lower, want: 3000 - 512},
		{name: "cache full with a queue inside the band: lower to one prompt",
			budget: 8192, s: Sample{Waiting: 2, HasWaiting: true, Running: 150, HasRunning: true, Load: 4000, MeanPrompt: 1000, Held: true, KVUsage: 0.97, HasKV: true},
			move: Lower, want: 1000},
		{name: "cache full, one prompt is below the floor: lower to the floor",
			budget: 8192, start: 900, s: Sample{Waiting: 1, HasWaiting: true, Load: 900, MeanPrompt: 300, Held: true, KVUsage: 1, HasKV: true},
			move: Lower, want: 512},
		{name: "cache full without a queue: hold",
			budget: 8192, s: Sample{Waiting: 0, HasWaiting: true, Running: 150, HasRunning: true, Load: 7168, MeanPrompt: 1000, Held: true, KVUsage: 0.99, HasKV: true},
			move: Hold, want: 7168},
		{name: "cache full, an empty queue below the start is no starvation",
			budget: 8192, start: 1000, s: Sample{Waiting: 0, HasWaiting: true, Running: 150, HasRunning: true, Load: 1000, MeanPrompt: 1000, Held: true, KVUsage: 0.95, HasKV: true},
			move: Hold, want: 1000},
		{name: "cache with room, a queue inside the band: hold",
			budget: 8192, s: Sample{Waiting: 2, HasWaiting: true, Running: 150, HasRunning: true, Load: 4000, MeanPrompt: 1000, Held: true, KVUsage: 0.5, HasKV: true},
			move: Hold, want: 7168},
		// The decode-bound level: 262,144 tokens of cache hold 229
		// requests of 1,000 + 140; finishing 229/140 per step they take in
		// 1,635 prompt tokens a step, so D = 1,635 − 1,000.
		{name: "decode-bound: the cache bounds the engine before its step budget: lower to its level",
			budget: 8192, s: decodeSample(1000, 140), move: Lower, want: 635},
		{name: "decode-bound: within one prompt of the level, hold",
			budget: 8192, start: 1600, s: decodeSample(1000, 140), move: Hold, want: 1600},
		{name: "decode-bound: a starved engine is raised to the level, not past it",
			budget: 8192, start: 512, s: decodeSample(1000, 140), move: Raise, want: 635},
		{name: "short outputs: the step budget bounds the engine, no decode-bound level",
			budget: 8192, s: decodeSample(512, 16), move: Hold, want: 7168},
		{name: "no output counters: no prediction the engine could correct",
			budget: 8192, s: func() Sample { s := decodeSample(1000, 140); s.HasOutput = false; return s }(), move: Hold, want: 7168},
		{name: "no cache size: no prediction",
			budget: 8192, s: func() Sample { s := decodeSample(1000, 140); s.KVTokens = 0; return s }(), move: Hold, want: 7168},
		{name: "no output asked: no prediction",
			budget: 8192, s: decodeSample(1000, 0), move: Hold, want: 7168},
		{name: "decode-bound, but idle with work held: starved, raise",
			budget: 8192, s: func() Sample { s := decodeSample(1000, 140); s.Running = 0; return s }(), move: Raise, want: 7168 + 1000},
		{name: "no waiting count: hold",
			budget: 8192, start: 4096, s: Sample{Waiting: 0, HasRunning: true, Load: 8192, MeanPrompt: 512, Held: true},
			move: Hold, want: 4096},
		{name: "unknown budget never raises",
			budget: 0, s: Sample{Waiting: 0, HasWaiting: true, Load: 8192, MeanPrompt: 512, Held: true},
			move: Hold, want: UnknownBudget},
		{name: "unknown budget lowers on a queue",
			budget: 0, s: Sample{Waiting: 10, HasWaiting: true, Load: 12 * 512, MeanPrompt: 512, Held: true},
			move: Lower, want: 1024 + 512},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := New(tt.budget)
			if tt.start != 0 {
				c.t = tt.start
			}
			m, _ := feed(c, 0, tt.s)
			if m != tt.move || c.Threshold() != tt.want {
				t.Fatalf("move %v threshold %d, want %v %d", m, c.Threshold(), tt.move, tt.want)
			}
		})
	}
}

// decodeSample is an engine early in a load whose requests (prompt p,
// asking for o output tokens) will fill its cache: it admits everything
// (no queue), runs some, its cache is far from full, and the picker holds
// more.
func decodeSample(p, o uint64) Sample {
	return Sample{Waiting: 0, HasWaiting: true, Running: 20, HasRunning: true, Load: 7168, MeanPrompt: p, Held: true,
		KVUsage: 0.1, HasKV: true, KVTokens: 262144, AskedOutput: o, HasOutput: true}
}

// A client that sets max_tokens far above what it gets makes the engine
// look decode-bound; the engine's own output counters correct it once
// requests finish, and the threshold climbs back to the start.
func TestEngineOutputCorrectsAGenerousMaxTokens(t *testing.T) {
	c := New(8192)
	s := decodeSample(512, 2048)
	m, at := feed(c, 0, s)
	if m != Lower || c.Threshold() != 512 {
		t.Fatalf("asked 2048: %v to %d, want lower to the floor 512", m, c.Threshold())
	}
	// Each window the engine finishes 10 requests of 16 tokens.
	windows := 0
	for c.Threshold() < 7168 && windows < 40 {
		s.GenerationTokens += 160
		s.Finished += 10
		m, at = feed(c, at, s)
		windows++
		if m == Lower {
			t.Fatalf("window %d: lowered to %d after the engine showed 16-token outputs", windows, c.Threshold())
		}
	}
	if c.Threshold() != 7168 || windows > 14 {
		t.Fatalf("threshold %d after %d windows, want back at the start 7168 within 14", c.Threshold(), windows)
	}
	t.Logf("back at %d after %d windows", c.Threshold(), windows)
	if got := c.Output(2048); got != 16 {
		t.Fatalf("Output(2048) = %d, want the engine's 16", got)
	}
	// A restart (the counters went back) forgets the engine's figure.
	s.GenerationTokens, s.Finished = 0, 0
	feed(c, at, s)
	if got := c.Output(2048); got != 2048 {
		t.Fatalf("after the counters went back, Output(2048) = %d, want the asked 2048", got)
	}
}

// A window decides only when every scrape of it agreed.
func TestMixedWindowHolds(t *testing.T) {
	c := New(8192)
	for i, w := range []int{0, 0, 3, 0, 0, 0} {
		if m := c.Observe(Sample{At: int64(i) * 100 * ms, Waiting: w, HasWaiting: true, Load: 8192, MeanPrompt: 512, Held: true}); m != Hold {
			t.Fatalf("scrape %d: %v", i, m)
		}
	}
	for i, w := range []int{20, 20, 1, 20, 20, 20} {
		if m := c.Observe(Sample{At: int64(i+6) * 100 * ms, Waiting: w, HasWaiting: true, Load: 8192, MeanPrompt: 512}); m != Hold {
			t.Fatalf("scrape %d: %v", i, m)
		}
	}
	if c.Threshold() != 7168 {
		t.Fatalf("threshold %d", c.Threshold())
	}
}

// A window needs Window and MinScrapes both.
func TestWindowLength(t *testing.T) {
	c := New(8192)
	s := Sample{Waiting: 0, HasWaiting: true, Load: 8192, MeanPrompt: 512, Held: true}
	for i := 0; i < 10; i++ { // ten scrapes in 450 ms
		s.At = int64(i) * 50 * ms
		if m := c.Observe(s); m != Hold {
			t.Fatalf("scrape %d at %d ms: %v before a full window", i, s.At/ms, m)
		}
	}
	c = New(8192)
	s.At = 0
	c.Observe(s)
	s.At = 2 * Window // two scrapes a long time apart
	if m := c.Observe(s); m != Hold {
		t.Fatalf("two scrapes decided %v", m)
	}
}

func TestReset(t *testing.T) {
	c := New(8192)
	feed(c, 0, Sample{Waiting: 30, HasWaiting: true, MeanPrompt: 512})
	if c.Threshold() >= 7168 {
		t.Fatalf("no lower: %d", c.Threshold())
	}
	c.Reset(4096)
	lo, hi := c.Bounds()
	if c.Threshold() != 3584 || lo != 256 || hi != 16384 || c.Budget() != 4096 {
		t.Fatalf("after reset: %d in [%d, %d], budget %d", c.Threshold(), lo, hi, c.Budget())
	}
}

// engineModel is a steady engine that takes intake tokens between scrapes
// (and is never idle): whatever the threshold lets the picker put beyond
// that waits.
func engineModel(threshold, intake, prompt uint64) Sample {
	load := threshold + prompt/2
	waiting := 0
	if load > intake {
		waiting = int((load - intake) / prompt)
	}
	return Sample{Waiting: waiting, HasWaiting: true, Running: 1, HasRunning: true, Load: load, MeanPrompt: prompt, Held: true}
}

// Against a steady engine the threshold settles and then holds: at most
// one reversal, and no move once settled, in the band, or at the start
// with an engine that takes all it is given.
func TestSettlesWithoutOscillation(t *testing.T) {
	for _, tc := range []struct{ budget, intake, prompt uint64 }{
		{8192, 8000, 512}, {8192, 2048, 512}, {8192, 20000, 512}, {4096, 3000, 128},
		{8192, 700, 512}, {2048, 30000, 2000},
	} {
		c := New(tc.budget)
		var moves []Move
		at := int64(0)
		for w := 0; w < 60; w++ {
			var m Move
			m, at = feed(c, at, engineModel(c.Threshold(), tc.intake, tc.prompt))
			if m != Hold {
				moves = append(moves, m)
			}
		}
		reversals := 0
		for i := 1; i < len(moves); i++ {
			if moves[i] != moves[i-1] {
				reversals++
			}
		}
		if reversals > 1 {
			t.Errorf("%+v: moves %v", tc, moves)
		}
		before := c.Threshold()
		for w := 0; w < 10; w++ {
			_, at = feed(c, at, engineModel(c.Threshold(), tc.intake, tc.prompt))
		}
		if c.Threshold() != before {
			t.Errorf("%+v: still moving after 60 windows: %d then %d", tc, before, c.Threshold())
		}
		s := engineModel(c.Threshold(), tc.intake, tc.prompt)
		lo, hi := c.Bounds()
		inBand := s.Waiting > 0 && uint64(s.Waiting)*tc.prompt <= c.Band(tc.prompt)
		atStart := s.Waiting == 0 && c.Threshold() == tc.budget*StartNum/StartDen
		if !inBand && !atStart && c.Threshold() != lo && c.Threshold() != hi {
			t.Errorf("%+v: settled at %d with %d waiting, outside the band and the bounds", tc, c.Threshold(), s.Waiting)
		}
	}
}

// FuzzInvariants drives a controller with arbitrary scrapes and checks,
// after each, the invariants the package documentation promises: the
// threshold within its bounds, no raise while the engine's waiting queue
// is over the band or the engine's cache is full, no lower while the
// engine shows no waiting request and the picker holds some.
func FuzzInvariants(f *testing.F) {
	f.Add(uint64(8192), []byte{0, 0, 0, 0, 0, 0, 0, 0, 20, 20, 20, 20, 20, 20, 1, 2, 3})
	f.Add(uint64(0), []byte{9, 9, 9, 9, 9, 9, 9, 0, 0, 0})
	f.Add(uint64(256), []byte{255, 1, 255, 1, 0, 0, 0, 0, 0})
	f.Add(uint64(8192), []byte{0x89, 64, 0x89, 64, 0x89, 64, 0x89, 64, 0x89, 64, 0x89, 64, 0x89, 70, 0x89, 70})
	f.Fuzz(func(t *testing.T, budget uint64, ops []byte) {
		budget %= 1 << 24
		c := New(budget)
		lo, hi := c.Bounds()
		at := int64(0)
		var gen, fin float64
		for i := 0; i+1 < len(ops); i += 2 {
			op, arg := ops[i], ops[i+1]
			if op == 255 {
				budget = uint64(arg) * 128
				c.Reset(budget)
				lo, hi = c.Bounds()
				continue
			}
			at += int64(op%8+1) * 40 * ms
			s := Sample{
				At: at, Waiting: int(arg % 64), HasWaiting: op&0x10 == 0,
				Load: uint64(arg) * uint64(op) * 37, MeanPrompt: uint64(op>>5) * 300,
				Held: op&0x08 != 0, Running: int(arg>>6) - 1, HasRunning: op&0x20 == 0,
				KVUsage: float64(arg%11) / 10, HasKV: op&0x40 == 0,
			}
			if op&0x80 != 0 { // a cache size, asked outputs and the engine's output counters
				s.KVTokens = uint64(arg) << 12
				s.AskedOutput = uint64(op&7) * uint64(arg) * 3
				gen += float64(arg % 32 * 40)
				fin += float64(arg % 7)
				s.GenerationTokens, s.Finished, s.HasOutput = gen, fin, op&0x04 == 0
			}
			before := c.Threshold()
			m := c.Observe(s)
			after := c.Threshold()
			if after < lo || after > hi {
				t.Fatalf("op %d: threshold %d outside [%d, %d]", i, after, lo, hi)
			}
			if (m == Raise) != (after > before) || (m == Lower) != (after < before) {
				t.Fatalf("op %d: move %v but %d -> %d", i, m, before, after)
			}
			p := max(s.MeanPrompt, 1)
			if s.HasWaiting && uint64(s.Waiting)*p > c.Band(p) && after > before {
				t.Fatalf("op %d: raised %d -> %d with %d waiting over the band %d", i, before, after, s.Waiting, c.Band(p))
			}
			if s.HasKV && s.KVUsage >= KVFull && after > before {
				t.Fatalf("op %d: raised %d -> %d with the cache full (%.2f)", i, before, after, s.KVUsage)
			}
			// An engine with no queue and work held is lowered only to the
			// decode-bound level, what its decodes free per step.
			bound, decodeBound := c.decodeBound(s, p)
			if s.HasWaiting && s.Waiting == 0 && s.Held && after < before && (!decodeBound || after != bound) {
				t.Fatalf("op %d: lowered %d -> %d while the engine queued nothing with work held (decode-bound %t at %d)", i, before, after, decodeBound, bound)
			}
			if decodeBound && after > before && after > bound {
				t.Fatalf("op %d: raised %d -> %d past the decode-bound level %d", i, before, after, bound)
			}
		}
	})
}

// Below the start, an engine whose sequences are all taken is not starved
// by an empty waiting queue: it is bound by its decodes. Once it has free
// sequences, it is.
func TestFullSequencesDoNotRaise(t *testing.T) {
	c := New(8192)
	c.t = 2048
	// A window with 3 waiting (inside the band) shows 16 sequences full.
	_, at := feed(c, 0, Sample{Waiting: 3, HasWaiting: true, Running: 16, HasRunning: true, MeanPrompt: 512, Load: 2048})
	full := Sample{Waiting: 0, HasWaiting: true, Running: 16, HasRunning: true, Load: 2048, MeanPrompt: 512, Held: true}
	m, at := feed(c, at, full)
	if m != Hold || c.Threshold() != 2048 {
		t.Fatalf("all 16 sequences running: %v to %d, want a hold", m, c.Threshold())
	}
	free := full
	free.Running = 8
	if m, _ := feed(c, at, free); m != Raise {
		t.Fatalf("8 of 16 sequences running: %v, want a raise", m)
	}
}
