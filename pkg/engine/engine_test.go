package engine

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

const ms = int64(time.Millisecond)

// job is one request of a test workload: it arrives at at and, when
// abortAt > 0, its client goes away then.
type job struct {
	at, abortAt int64
	req         Request
}

// logLine is one event as the tests compare them.
type logLine struct {
	kind EventKind
	id   uint64
	at   int64
}

func (l logLine) String() string { return fmt.Sprintf("%s #%d @%d", l.kind, l.id, l.at) }

// result is what a driven workload did.
type result struct {
	log     []logLine
	seqs    []*Seq // by job index
	wakes   int    // Advance calls that completed a step
	aborted int
}

// drive runs jobs through an engine in virtual time the way a simulator
// does: at each instant, Advance, then the arrivals and aborts of that
// instant, then Schedule; then jump to the next instant anything happens.
// It checks the engine's invariants after every instant.
func drive(t *testing.T, cfg Config, jobs []job) result {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var res result
	res.seqs = make([]*Seq, len(jobs))
	order := make([]int, len(jobs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return int(jobs[a].at - jobs[b].at) })
	type abort struct {
		at  int64
		job int
	}
	var aborts []abort
	for i, j := range jobs {
		if j.abortAt > 0 {
			aborts = append(aborts, abort{j.abortAt, i})
		}
	}
	slices.SortStableFunc(aborts, func(a, b abort) int { return int(a.at - b.at) })
	next, nextAbort := 0, 0
	wake, busy := int64(0), false
	var evs []Event
	logEvents := func(evs []Event) {
		for _, ev := range evs {
			res.log = append(res.log, logLine{ev.Kind, ev.Seq.ID, ev.At})
		}
	}
	for steps := 0; ; steps++ {
		if steps > 10_000_000 {
			t.Fatal("workload did not end")
		}
		now := int64(-1)
		pick := func(at int64) {
			if now < 0 || at < now {
				now = at
			}
		}
		if next < len(order) {
			pick(jobs[order[next]].at)
		}
		if nextAbort < len(aborts) {
			pick(aborts[nextAbort].at)
		}
		if busy {
			pick(wake)
		}
		if now < 0 {
			break
		}
		before := e.Stats().Steps
		evs = e.Advance(now, evs[:0])
		if e.Stats().Steps != before {
			res.wakes++
		}
		logEvents(evs)
		for next < len(order) && jobs[order[next]].at == now {
			i := order[next]
			s, err := e.Submit(now, jobs[i].req)
			if err != nil {
				t.Fatalf("job %d: %v", i, err)
			}
			res.seqs[i] = s
			next++
		}
		for nextAbort < len(aborts) && aborts[nextAbort].at == now {
			if s := res.seqs[aborts[nextAbort].job]; s != nil && e.Abort(now, s) {
				res.aborted++
			}
			nextAbort++
		}
		evs, wake, busy = e.Schedule(now, evs[:0])
		logEvents(evs)
		if busy && wake < now {
			t.Fatalf("wake %d before now %d", wake, now)
		}
		checkInvariants(t, e)
	}
	st := e.Stats()
	if st.Running != 0 || st.Waiting != 0 || st.UsedBlocks != 0 {
		t.Fatalf("after the workload: %+v, want nothing running, waiting or held", st)
	}
	return res
}

func checkInvariants(t *testing.T, e *Engine) {
	t.Helper()
	st := e.Stats()
	if st.Running > e.cfg.MaxNumSeqs {
		t.Fatalf("%d running, at most %d allowed", st.Running, e.cfg.MaxNumSeqs)
	}
	if st.UsedBlocks+st.CachedBlocks > st.TotalBlocks || st.UsedBlocks < 0 {
		t.Fatalf("blocks used %d + cached %d of %d", st.UsedBlocks, st.CachedBlocks, st.TotalBlocks)
	}
	if e.prefilling+e.decoding != e.running {
		t.Fatalf("prefilling %d + decoding %d != running %d", e.prefilling, e.decoding, e.running)
	}
	tokens := e.decoding
	for _, c := range e.cur.chunks {
		tokens += c.tokens
	}
	if e.cur.active && tokens > e.cfg.MaxNumBatchedTokens {
		t.Fatalf("step of %d tokens, budget %d", tokens, e.cfg.MaxNumBatchedTokens)
	}
}

// seqTimes returns a request's time to first token and to its end.
func seqTimes(s *Seq) (ttft, total time.Duration) {
	return time.Duration(s.FirstToken - s.Arrival), time.Duration(s.Finish - s.Arrival)
}

// prompt returns the block hashes of a prompt of n tokens whose first
// shared tokens belong to prefix group g (unique blocks otherwise).
func prompt(bs, n, shared int, g, unique uint64) []uint64 {
	var hs []uint64
	for i := 0; i+bs <= n; i += bs {
		if i+bs <= shared {
			hs = append(hs, g<<32|uint64(i/bs)+1)
		} else {
			hs = append(hs, unique<<40|uint64(i/bs)+1)
		}
	}
	return hs
}

func testConfig(mut func(*Config)) Config {
	c := DefaultConfig()
	if mut != nil {
		mut(&c)
	}
	return c
}

// TestLoneRequestTiming checks the formulas of the package documentation
// on a lone request: exactly, since the clock is virtual.
func TestLoneRequestTiming(t *testing.T) {
	tests := []struct {
		name             string
		mut              func(*Config)
		prompt, maxToks  int
		wantTTFT, wantTo time.Duration
	}{
		{"prefill only", func(c *Config) { c.PrefillTokensPerSec = 2000 }, 300, 1, 150 * time.Millisecond, 150 * time.Millisecond},
		{"prefill and decode", func(c *Config) {
			c.PrefillTokensPerSec = 2000
			c.TimePerOutputToken = 30 * time.Millisecond
		}, 400, 6, 200 * time.Millisecond, 350 * time.Millisecond},
		// 600 tokens at 256 per step: chunks of 256, 256 and 88.
		{"chunked prefill over three steps", func(c *Config) {
			c.PrefillTokensPerSec = 3000
			c.MaxNumBatchedTokens = 256
		}, 600, 1, 200 * time.Millisecond, 200 * time.Millisecond},
		{"speedup divides durations", func(c *Config) {
			c.PrefillTokensPerSec = 200
			c.TimePerOutputToken = 200 * time.Millisecond
			c.Speedup = 10
		}, 400, 3, 200 * time.Millisecond, 240 * time.Millisecond},
	}
	for _, tt := range tests {
		for _, coalesce := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/coalesce=%t", tt.name, coalesce), func(t *testing.T) {
				cfg := testConfig(tt.mut)
				cfg.Coalesce = coalesce
				res := drive(t, cfg, []job{{at: 5 * ms, req: Request{PromptTokens: tt.prompt, MaxTokens: tt.maxToks}}})
				ttft, total := seqTimes(res.seqs[0])
				// Float rounding of each step's length: within a
				// microsecond.
				if d := ttft - tt.wantTTFT; d < -time.Microsecond || d > time.Microsecond {
					t.Errorf("TTFT %v, want %v", ttft, tt.wantTTFT)
				}
				if d := total - tt.wantTo; d < -time.Microsecond || d > time.Microsecond {
					t.Errorf("total %v, want %v", total, tt.wantTo)
				}
				if ttft != cfg.PrefillTime(tt.prompt) && tt.name != "chunked prefill over three steps" {
					t.Errorf("TTFT %v, PrefillTime says %v", ttft, cfg.PrefillTime(tt.prompt))
				}
				if g := res.seqs[0].generated; g != tt.maxToks {
					t.Errorf("generated %d tokens, want %d", g, tt.maxToks)
				}
			})
		}
	}
}

// TestSharedPrefillAndSlots: concurrent prompts share the prefill
// throughput, and at most MaxNumSeqs run; the rest start in arrival order
// as slots free up.
func TestSharedPrefillAndSlots(t *testing.T) {
	cfg := testConfig(func(c *Config) {
		c.MaxNumSeqs = 4
		c.PrefillTokensPerSec = 40000
		c.TimePerOutputToken = 10 * time.Millisecond
		c.EnablePrefixCaching = false
	})
	var jobs []job
	for range 10 {
		jobs = append(jobs, job{req: Request{PromptTokens: 512, MaxTokens: 1}})
	}
	res := drive(t, cfg, jobs)
	// Four 512-token prompts in one step: 2048 / 40000 s = 51.2 ms each.
	want := []int64{51200000, 51200000, 51200000, 51200000, 102400000, 102400000, 102400000, 102400000, 128000000, 128000000}
	var got []int64
	for _, s := range res.seqs {
		got = append(got, s.FirstToken)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("first tokens at %v ns, want %v", got, want)
	}
	var starts []uint64
	for _, l := range res.log {
		if l.kind == Started {
			starts = append(starts, l.id)
		}
	}
	if !slices.IsSorted(starts) || len(starts) != 10 {
		t.Fatalf("start order %v, want arrival order", starts)
	}
}

// TestPriorityOrder: under the priority policy the waiting queue starts
// by priority, lower first, then arrival; under fcfs by arrival.
func TestPriorityOrder(t *testing.T) {
	prios := []int{5, 1, 3, 1, 0, -2}
	for _, tt := range []struct {
		policy string
		want   []int
	}{
		{PolicyPriority, []int{-2, 0, 1, 1, 3, 5}},
		{PolicyFCFS, []int{5, 1, 3, 1, 0, -2}},
	} {
		t.Run(tt.policy, func(t *testing.T) {
			cfg := testConfig(func(c *Config) { c.MaxNumSeqs = 1; c.SchedulingPolicy = tt.policy })
			jobs := []job{{req: Request{PromptTokens: 16, MaxTokens: 50}}} // the blocker
			for i, p := range prios {
				jobs = append(jobs, job{at: int64(i+1) * ms, req: Request{PromptTokens: 16, MaxTokens: 1, Priority: p}})
			}
			res := drive(t, cfg, jobs)
			var got []int
			for _, l := range res.log {
				if l.kind == Started && l.id > 1 {
					got = append(got, prios[l.id-2])
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("start order by priority %v, want %v", got, tt.want)
			}
		})
	}
}

// TestPrefixCache: a prompt sent again is served from the cache except its
// last block, and prefills only the rest; with caching off nothing hits.
func TestPrefixCache(t *testing.T) {
	for _, tt := range []struct {
		name       string
		caching    bool
		prompt     int
		wantCached int
	}{
		{"cached", true, 4000, 3984},
		{"block-aligned prompt", true, 4096, 4080},
		{"caching disabled", false, 4000, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(func(c *Config) { c.EnablePrefixCaching = tt.caching })
			h := prompt(cfg.BlockSize, tt.prompt, tt.prompt, 7, 0)
			res := drive(t, cfg, []job{
				{at: 0, req: Request{PromptTokens: tt.prompt, Hashes: h, MaxTokens: 1}},
				{at: time.Second.Nanoseconds(), req: Request{PromptTokens: tt.prompt, Hashes: h, MaxTokens: 1}},
			})
			a, b := res.seqs[0], res.seqs[1]
			if a.CachedTokens != 0 || b.CachedTokens != tt.wantCached {
				t.Fatalf("cached tokens %d, %d; want 0, %d", a.CachedTokens, b.CachedTokens, tt.wantCached)
			}
			ta, _ := seqTimes(a)
			tb, _ := seqTimes(b)
			if want := cfg.PrefillTime(tt.prompt - tt.wantCached); tb != want {
				t.Errorf("second TTFT %v, want the prefill of its %d uncached tokens, %v", tb, tt.prompt-tt.wantCached, want)
			}
			if tt.caching && tb >= ta {
				t.Errorf("second TTFT %v not below first %v", tb, ta)
			}
		})
	}
}

// TestCacheFullStopsAdmission: a request whose blocks do not fit waits at
// the head of the queue, and nothing behind it starts, until blocks free.
func TestCacheFullStopsAdmission(t *testing.T) {
	cfg := testConfig(func(c *Config) { c.NumGPUBlocks = 10; c.BlockSize = 16 })
	res := drive(t, cfg, []job{
		{req: Request{PromptTokens: 100, MaxTokens: 20}},       // 8 blocks
		{at: ms, req: Request{PromptTokens: 60, MaxTokens: 4}}, // 4 blocks: must wait
		{at: ms, req: Request{PromptTokens: 16, MaxTokens: 4}}, // 2 blocks: fits, but waits behind
	})
	first, second, third := res.seqs[0], res.seqs[1], res.seqs[2]
	if second.Start != first.Finish || third.Start != first.Finish {
		t.Fatalf("starts %d and %d, want both at the first's finish %d", second.Start, third.Start, first.Finish)
	}
}

// TestLoRASlots: with MaxLoRAs 1 a request of a second adapter is skipped
// while another adapter runs, and the queue behind it is not blocked.
func TestLoRASlots(t *testing.T) {
	cfg := testConfig(func(c *Config) { c.MaxLoRAs = 1 })
	res := drive(t, cfg, []job{
		{req: Request{PromptTokens: 16, MaxTokens: 30, LoRA: "a"}},
		{at: ms, req: Request{PromptTokens: 16, MaxTokens: 1, LoRA: "b"}},
		{at: ms, req: Request{PromptTokens: 16, MaxTokens: 1, LoRA: "a"}},
		{at: ms, req: Request{PromptTokens: 16, MaxTokens: 1}},
	})
	a, b, a2, base := res.seqs[0], res.seqs[1], res.seqs[2], res.seqs[3]
	if b.Start < a.Finish {
		t.Errorf("adapter b started at %d while a ran until %d", b.Start, a.Finish)
	}
	if a2.Start >= a.Finish || base.Start >= a.Finish {
		t.Errorf("a second a request (start %d) and a base request (start %d) waited behind b", a2.Start, base.Start)
	}
}

// TestAbort: an aborted waiting request never starts; an aborted running
// one frees its slot at once, emits nothing more and keeps the tokens it
// had.
func TestAbort(t *testing.T) {
	cfg := testConfig(func(c *Config) { c.MaxNumSeqs = 1; c.TimePerOutputToken = 10 * time.Millisecond })
	for _, coalesce := range []bool{false, true} {
		t.Run(fmt.Sprintf("coalesce=%t", coalesce), func(t *testing.T) {
			cfg.Coalesce = coalesce
			res := drive(t, cfg, []job{
				{req: Request{PromptTokens: 16, MaxTokens: 1000}, abortAt: 105 * ms},
				{at: ms, req: Request{PromptTokens: 16, MaxTokens: 1}, abortAt: 50 * ms},
				{at: ms, req: Request{PromptTokens: 16, MaxTokens: 2}},
			})
			long, gone, next := res.seqs[0], res.seqs[1], res.seqs[2]
			if long.State() != Aborted || gone.State() != Aborted || next.State() != Finished || res.aborted != 2 {
				t.Fatalf("states %s, %s, %s (%d aborts)", long.State(), gone.State(), next.State(), res.aborted)
			}
			if gone.Start != 0 || gone.FirstToken != 0 {
				t.Errorf("the request aborted while waiting started at %d", gone.Start)
			}
			// Prefill of 16 tokens (0.8 ms), then a token every 10.8 ms
			// ... the long request is in the step ending after 105 ms.
			if next.Start <= 105*ms || next.Start > 120*ms {
				t.Errorf("next started at %d, want right after the abort at 105 ms", next.Start)
			}
			if g := long.generated; g < 9 || g > 11 {
				t.Errorf("the aborted request kept %d tokens, want about 10", g)
			}
			for _, l := range res.log {
				if l.id == long.ID && l.kind == Done {
					t.Errorf("the aborted request emitted %s", l)
				}
			}
		})
	}
}

// TestSubmitJoinsStepStartingNow: requests submitted at the instant a step
// starts, before Schedule, share that step; one submitted after Schedule
// waits for the next.
func TestSubmitJoinsStepStartingNow(t *testing.T) {
	cfg := testConfig(func(c *Config) { c.PrefillTokensPerSec = 1000; c.TimePerOutputToken = 0 })
	e, _ := New(cfg)
	a, _ := e.Submit(0, Request{PromptTokens: 100, MaxTokens: 1})
	b, _ := e.Submit(0, Request{PromptTokens: 100, MaxTokens: 1})
	_, wake, ok := e.Schedule(0, nil)
	if !ok || wake != 200*ms {
		t.Fatalf("step ends at %d (ok %t), want 200 ms: both prompts in it", wake, ok)
	}
	c, _ := e.Submit(0, Request{PromptTokens: 100, MaxTokens: 1})
	evs := e.Advance(wake, nil)
	if len(evs) != 4 || a.FirstToken != wake || b.FirstToken != wake {
		t.Fatalf("events %v", evs)
	}
	_, wake, _ = e.Schedule(wake, nil)
	e.Advance(wake, nil)
	if c.FirstToken != 300*ms {
		t.Fatalf("late request's first token at %d, want 300 ms", c.FirstToken)
	}
}

// TestCoalesceIsExact runs random workloads (arrivals, shared prefixes,
// priorities, aborts, cache pressure) with Coalesce off and on: the event
// logs must be identical, and coalescing must need fewer wake-ups.
func TestCoalesceIsExact(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	for round := range 30 {
		cfg := DefaultConfig()
		cfg.MaxNumSeqs = 1 + r.IntN(16)
		cfg.MaxNumBatchedTokens = cfg.MaxNumSeqs + r.IntN(4096)
		cfg.PrefillTokensPerSec = float64(1000 + r.IntN(50000))
		cfg.TimePerOutputToken = time.Duration(r.IntN(30)) * time.Millisecond
		cfg.NumGPUBlocks = 200 + r.IntN(2000)
		cfg.EnablePrefixCaching = r.IntN(2) == 0
		if r.IntN(2) == 0 {
			cfg.SchedulingPolicy = PolicyPriority
		}
		var jobs []job
		at := int64(0)
		for i := range 50 + r.IntN(200) {
			at += r.Int64N(40 * ms)
			n := 1 + r.IntN(1500)
			out := 1 + r.IntN(300)
			if cfg.Blocks(n, out) > cfg.NumGPUBlocks {
				continue
			}
			j := job{at: at, req: Request{PromptTokens: n, MaxTokens: out, Priority: r.IntN(3),
				Hashes: prompt(cfg.BlockSize, n, r.IntN(n+1), uint64(r.IntN(4)), uint64(i+1))}}
			if r.IntN(8) == 0 {
				j.abortAt = at + r.Int64N(2000*ms)
			}
			jobs = append(jobs, j)
		}
		cfg.Coalesce = false
		plain := drive(t, cfg, jobs)
		cfg.Coalesce = true
		fast := drive(t, cfg, jobs)
		if d := diff(plain.log, fast.log); d != "" {
			t.Fatalf("round %d (%+v): coalesced timeline differs: %s", round, cfg, d)
		}
		for i := range jobs {
			if a, b := plain.seqs[i].generated, fast.seqs[i].generated; a != b {
				t.Fatalf("round %d: job %d generated %d tokens, coalesced %d", round, i, a, b)
			}
		}
		if fast.wakes > plain.wakes {
			t.Fatalf("round %d: coalesced %d wake-ups, plain %d", round, fast.wakes, plain.wakes)
		}
	}
}

func diff(a, b []logLine) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("event %d: %s vs %s", i, a[i], b[i])
		}
	}
	if len(a) != len(b) {
		return fmt.Sprintf("%d events vs %d", len(a), len(b))
	}
	return ""
}

// TestCoalesceCost: a long generation costs a handful of wake-ups when
// coalesced, one per token otherwise.
func TestCoalesceCost(t *testing.T) {
	var jobs []job
	for i := range 8 {
		jobs = append(jobs, job{at: int64(i) * ms, req: Request{PromptTokens: 100, MaxTokens: 1000 + 100*i}})
	}
	cfg := DefaultConfig()
	plain := drive(t, cfg, jobs)
	cfg.Coalesce = true
	fast := drive(t, cfg, jobs)
	if plain.wakes < 1700 || fast.wakes > 30 {
		t.Fatalf("wake-ups: plain %d, coalesced %d; want about 1,700 and about 24", plain.wakes, fast.wakes)
	}
}

// TestSubmitRejects: requests the engine can never run are refused.
func TestSubmitRejects(t *testing.T) {
	e, _ := New(testConfig(func(c *Config) { c.NumGPUBlocks = 4 }))
	for _, r := range []Request{{PromptTokens: 0, MaxTokens: 1}, {PromptTokens: 1, MaxTokens: 0}, {PromptTokens: 60, MaxTokens: 10}} {
		if _, err := e.Submit(0, r); err == nil {
			t.Errorf("Submit(%+v) accepted", r)
		}
	}
}

// TestCallWithoutAdvancePanics: a driver that skips Advance past a step's
// end is told so instead of getting a wrong timeline.
func TestCallWithoutAdvancePanics(t *testing.T) {
	e, _ := New(DefaultConfig())
	_, _ = e.Submit(0, Request{PromptTokens: 10, MaxTokens: 1})
	_, wake, _ := e.Schedule(0, nil)
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "call Advance first") {
			t.Fatalf("recovered %v, want the Advance message", r)
		}
	}()
	_, _ = e.Submit(wake+1, Request{PromptTokens: 10, MaxTokens: 1})
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		mut  func(*Config)
		want string
	}{
		{"defaults", func(*Config) {}, ""},
		{"zero seqs", func(c *Config) { c.MaxNumSeqs = 0 }, "--max-num-seqs"},
		{"budget below seqs", func(c *Config) { c.MaxNumSeqs = 8; c.MaxNumBatchedTokens = 4 }, "--max-num-batched-tokens"},
		{"zero speed", func(c *Config) { c.PrefillTokensPerSec = 0 }, "--prefill-tokens-per-sec"},
		{"negative decode", func(c *Config) { c.TimePerOutputToken = -1 }, "--time-per-output-token"},
		{"bad policy", func(c *Config) { c.SchedulingPolicy = "lifo" }, "--scheduling-policy"},
		{"zero blocks", func(c *Config) { c.NumGPUBlocks = 0 }, "--num-gpu-blocks"},
		{"zero speedup means 1", func(c *Config) { c.Speedup = 0 }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.mut(&c)
			err := c.Validate()
			if (err == nil) != (tt.want == "") || (err != nil && !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("Validate() = %v, want an error naming %q", err, tt.want)
			}
		})
	}
}

// BenchmarkDecodeHeavy is a server with 256 requests decoding
// each (4,000 to 6,550 tokens): the coalesced engine wakes per finish, the plain one per token.
func BenchmarkDecodeHeavy(b *testing.B) {
	for _, coalesce := range []bool{false, true} {
		b.Run(fmt.Sprintf("coalesce=%t", coalesce), func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.Coalesce = coalesce
			var evs []Event
			b.ReportAllocs()
			for b.Loop() {
				e, _ := New(cfg)
				now := int64(0)
				for i := range 256 {
					_, _ = e.Submit(now, Request{PromptTokens: 64, MaxTokens: 4000 + 10*i})
				}
				for {
					var wake int64
					var ok bool
					evs, wake, ok = e.Schedule(now, evs[:0])
					if !ok {
						break
					}
					now = wake
					evs = e.Advance(now, evs[:0])
				}
			}
		})
	}
}
