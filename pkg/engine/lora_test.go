package engine

import (
	"slices"
	"testing"
	"time"
)

// TestLoRALoads: adapters stay resident between requests; a new adapter
// takes a free slot, then the least recently used idle one; each load
// lengthens the step that admits it by LoRALoadTime.
func TestLoRALoads(t *testing.T) {
	cfg := testConfig(func(c *Config) {
		c.MaxLoRAs = 2
		c.LoRALoadTime = 50 * time.Millisecond
		c.PrefillTokensPerSec = 16000 // 16 tokens: 1 ms
	})
	for _, coalesce := range []bool{false, true} {
		cfg.Coalesce = coalesce
		// One at a time: each arrives after the previous finished.
		var jobs []job
		for i, a := range []string{"a", "b", "a", "c", "b", "a", "a"} {
			jobs = append(jobs, job{at: int64(i) * 100 * ms, req: Request{PromptTokens: 16, MaxTokens: 1, LoRA: a}})
		}
		e, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		var ttft []time.Duration
		var evs []Event
		for _, j := range jobs {
			evs = e.Advance(j.at, evs[:0])
			s, err := e.Submit(j.at, j.req)
			if err != nil {
				t.Fatal(err)
			}
			var wake int64
			evs, wake, _ = e.Schedule(j.at, evs[:0])
			evs = e.Advance(wake, evs[:0])
			ttft = append(ttft, time.Duration(s.FirstToken-j.at))
			e.Schedule(wake, evs[:0])
		}
		// a, b load; a resident; c evicts b (a was used last); b evicts a;
		// a evicts c; a resident.
		load, hit := 51*time.Millisecond, time.Millisecond
		want := []time.Duration{load, load, hit, load, load, load, hit}
		if !slices.Equal(ttft, want) {
			t.Errorf("coalesce %t: time to first token %v, want %v", coalesce, ttft, want)
		}
		if st := e.Stats(); st.LoRALoads != 5 {
			t.Errorf("coalesce %t: %d loads, want 5", coalesce, st.LoRALoads)
		}
		if got := e.ResidentAdapters(); !slices.Equal(got, []string{"b", "a"}) {
			t.Errorf("coalesce %t: resident %v, want [b a]", coalesce, got)
		}
	}
}

// TestLoRABusySlotsWait: a new adapter waits while every slot holds an
// adapter in use, and loads once one is idle.
func TestLoRABusySlotsWait(t *testing.T) {
	cfg := testConfig(func(c *Config) { c.MaxLoRAs = 1; c.LoRALoadTime = 10 * time.Millisecond })
	res := drive(t, cfg, []job{
		{req: Request{PromptTokens: 16, MaxTokens: 20, LoRA: "a"}},
		{at: ms, req: Request{PromptTokens: 16, MaxTokens: 1, LoRA: "b"}},
	})
	a, b := res.seqs[0], res.seqs[1]
	if b.Start < a.Finish {
		t.Errorf("b started at %d while a, holding the only slot, ran until %d", b.Start, a.Finish)
	}
}

// TestTransferredTokens: a request whose prompt's KV arrives with it
// computes only its last token.
func TestTransferredTokens(t *testing.T) {
	cfg := testConfig(func(c *Config) { c.PrefillTokensPerSec = 1000; c.TimePerOutputToken = 0 })
	res := drive(t, cfg, []job{{req: Request{PromptTokens: 1000, MaxTokens: 1, TransferredTokens: 1000}}})
	s := res.seqs[0]
	if s.CachedTokens != 999 || time.Duration(s.FirstToken-s.Arrival) != time.Millisecond {
		t.Errorf("cached %d, first token after %v; want 999 cached and 1 ms (one token)", s.CachedTokens, time.Duration(s.FirstToken-s.Arrival))
	}
}
