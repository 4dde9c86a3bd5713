package sched

import (
	"testing"

	"github.com/laneway-dev/laneway/pkg/podmetrics"
	"github.com/laneway-dev/laneway/pkg/tokenize"
)

// lastChoice is a Chooser that keeps a copy of the candidates of its
// last call and leaves the order to inner.
type lastChoice struct {
	inner Chooser
	cands []Candidate
}

func (p *lastChoice) Choose(t *Ticket, cands []Candidate, out []int) []int {
	p.cands = append(p.cands[:0], cands...)
	return p.inner.Choose(t, cands, out)
}

func (p *lastChoice) byAddr() map[string]Candidate {
	m := map[string]Candidate{}
	for _, c := range p.cands {
		m[c.Addr] = c
	}
	return m
}

// TestQueuedGrantRanksFreshOverlap: a queued request's grant ranks the
// candidates by their prefix overlap at the grant, including an endpoint
// that was not eligible when the request was admitted (here one back from
// the overload filter), whose overlap the admission never measured.
func TestQueuedGrantRanksFreshOverlap(t *testing.T) {
	const a, b = "10.0.0.1:8000", "10.0.0.2:8000"
	pick := &lastChoice{inner: NewLeastLoaded(1)}
	c := newCore(t, byHeader(100, class("standard", 1, 0)),
		Options{Chooser: pick, Prefix: &PrefixOptions{}, MaxEngineQueue: 2}, a, b)

	toks := make([]uint32, 320)
	for i := range toks {
		toks[i] = uint32(i) + 1
	}
	// 19 cacheable blocks of 16 (the last block holds the last token).
	prompt := &Ticket{RawISL: 320, BlockSize: 16, Blocks: tokenize.BlockHashes(toks, 16)}
	c.index.Record(int(c.reg.byAddr[b].id), prompt.Blocks, 16, 0)
	c.SetMetrics(0, b, podmetrics.Metrics{Waiting: 3, Known: podmetrics.Waiting}, false) // b past the filter

	admit(c, 0, &Ticket{RawISL: 500}) // a is busy after it
	if l := c.Drain(0); len(l) != 1 || l[0].Grant == nil || l[0].Grant.Endpoints[0] != a {
		t.Fatalf("filler: %v, want a direct grant on %s", l, a)
	}
	r := admit(c, 0, prompt)
	if l := c.Drain(0); len(l) != 0 {
		t.Fatalf("prompt behind a busy endpoint: %s, want it queued", leaveString(l[0]))
	}
	if prompt.Cached != 0 {
		t.Fatalf("snapshot over %s alone: Cached = %d, want 0", a, prompt.Cached)
	}

	c.SetMetrics(0, b, podmetrics.Metrics{Waiting: 0, Known: podmetrics.Waiting}, false) // b is back
	l := c.Drain(0)
	if len(l) != 1 || l[0].Req != r || l[0].Grant == nil {
		t.Fatalf("after b came back: %v, want the prompt granted", l)
	}
	got := pick.byAddr()
	for _, want := range []Candidate{{Addr: a, CachedTokens: 0, Busy: true}, {Addr: b, CachedTokens: 19 * 16}} {
		if x, ok := got[want.Addr]; !ok || x.CachedTokens != want.CachedTokens || x.Busy != want.Busy {
			t.Errorf("candidate %s: %+v (present %t), want CachedTokens %d, busy %t", want.Addr, x, ok, want.CachedTokens, want.Busy)
		}
	}
	if ep := l[0].Grant.Endpoints[0]; ep != b {
		t.Errorf("granted %s, want %s (not busy)", ep, b)
	}
}
