package sched

import (
	"testing"

	"github.com/laneway-dev/laneway/pkg/podmetrics"
)

const (
	loraA, loraB, loraC = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"
)

// loraScrape delivers a fresh scrape with adapter state.
func loraScrape(c *Core, addr string, running []string, max int) {
	c.SetMetrics(0, addr, podmetrics.Metrics{Known: podmetrics.Waiting | podmetrics.Running | podmetrics.LoRA,
		LoRA: podmetrics.LoRAInfo{Running: running, MaxLoRA: max}}, false)
}

// TestLoRATiers: an adapter request goes where its adapter runs, else
// where there is room for it, else by load; a base-model request by load
// alone. Both choosers rank the tier before load.
func TestLoRATiers(t *testing.T) {
	for _, tc := range []struct {
		name string
		ch   func() Chooser
	}{
		{"least-loaded", func() Chooser { return NewLeastLoaded(1) }},
		{"cost", func() Chooser { return NewCostChooser(1, 1) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCore(t, byHeader(0, class("c", 1, 0)), Options{Chooser: tc.ch()}, loraA, loraB, loraC)
			loraScrape(c, loraA, []string{"x", "y"}, 2)
			loraScrape(c, loraB, []string{"z"}, 2)
			loraScrape(c, loraC, []string{"w", "v"}, 2)
			// Load C and A so that load alone would never pick B or A.
			grantOne(t, c, 0, &Ticket{RawISL: 3000, Allow: []string{loraA}, HasAllow: true})
			grantOne(t, c, 0, &Ticket{RawISL: 900, Allow: []string{loraB}, HasAllow: true})

			g := grantOne(t, c, 0, &Ticket{RawISL: 100, Model: "x"})
			if g.Endpoints[0] != loraA || g.LoRA != LoRARunning {
				t.Errorf("adapter x: %v (%s), want %s where it runs", g.Endpoints, g.LoRA, loraA)
			}
			g = grantOne(t, c, 0, &Ticket{RawISL: 100, Model: "w"})
			if g.Endpoints[0] != loraC || g.LoRA != LoRARunning {
				t.Errorf("adapter w: %v (%s), want %s", g.Endpoints, g.LoRA, loraC)
			}
			// u runs nowhere but is known: C reported it waiting once.
			c.SetMetrics(0, loraC, podmetrics.Metrics{Known: podmetrics.LoRA,
				LoRA: podmetrics.LoRAInfo{Running: []string{"w", "v"}, Waiting: []string{"u"}, MaxLoRA: 2}}, false)
			loraScrape(c, loraC, []string{"w", "v"}, 2) // u no longer listed, but known
			g = grantOne(t, c, 0, &Ticket{RawISL: 100, Model: "u"})
			if g.Endpoints[0] != loraB || g.LoRA != LoRARoom {
				t.Errorf("adapter u: %v (%s), want %s, the one with room", g.Endpoints, g.LoRA, loraB)
			}
			// A base-model request ignores adapters: C has the least load.
			g = grantOne(t, c, 0, &Ticket{RawISL: 100, Model: "base"})
			if g.LoRA != LoRANone {
				t.Errorf("base model: outcome %q, want none", g.LoRA)
			}
		})
	}
}

// TestLoRAOwnRequestsCount: before any scrape shows it, an adapter this
// picker sent to an endpoint counts as running there until the request
// ends.
func TestLoRAOwnRequestsCount(t *testing.T) {
	c := newCore(t, byHeader(0, class("c", 1, 0)), Options{}, loraA, loraB)
	loraScrape(c, loraA, nil, 4)
	loraScrape(c, loraB, []string{"x"}, 4) // x is known
	loraScrape(c, loraB, nil, 4)           // and runs nowhere now
	g1 := grantOne(t, c, 0, &Ticket{RawISL: 100, Model: "x"})
	first := g1.Endpoints[0]
	for range 3 {
		g := grantOne(t, c, 0, &Ticket{RawISL: 100, Model: "x"})
		if g.Endpoints[0] != first || g.LoRA != LoRARunning {
			t.Fatalf("x again: %v (%s), want %s where ours runs", g.Endpoints, g.LoRA, first)
		}
		c.Release(g, EventDone)
	}
	c.Release(g1, EventDone)
	if n := c.reg.byAddr[first].lora.ours["x"]; n != 0 {
		t.Errorf("after every release %d of ours still counted", n)
	}
}

// TestLoRABalanceGuard: an endpoint holding more than twice the least
// loaded's in-flight requests plus 16 loses its tier.
func TestLoRABalanceGuard(t *testing.T) {
	c := newCore(t, byHeader(0, class("c", 1, 0)), Options{}, loraA, loraB)
	loraScrape(c, loraA, []string{"x"}, 2)
	loraScrape(c, loraB, []string{"y", "z"}, 2) // no room for x
	// A keeps its tier while it holds at most 2 × B's + 16 (B holds none).
	want := make([]string, 17)
	for i := range want {
		want[i] = loraA
	}
	want = append(want, loraB)
	for i, want := range want {
		g := grantOne(t, c, 0, &Ticket{RawISL: 10, Model: "x"})
		if g.Endpoints[0] != want {
			_, onA := account(c, loraA)
			_, onB := account(c, loraB)
			t.Fatalf("request %d: %v, want %s (in flight now A %d, B %d)", i, g.Endpoints, want, onA, onB)
		}
	}
}

// TestLoRAAffinityOff: with affinity disabled, no tier and no outcome.
func TestLoRAAffinityOff(t *testing.T) {
	c := newCore(t, byHeader(0, class("c", 1, 0)), Options{DisableLoRAAffinity: true}, loraA, loraB)
	loraScrape(c, loraA, []string{"x"}, 2)
	loraScrape(c, loraB, nil, 2)
	grantOne(t, c, 0, &Ticket{RawISL: 500, Allow: []string{loraA}, HasAllow: true})
	g := grantOne(t, c, 0, &Ticket{RawISL: 10, Model: "x"})
	if g.Endpoints[0] != loraB || g.LoRA != LoRANone {
		t.Errorf("affinity off: %v (%q), want the least loaded %s and no outcome", g.Endpoints, g.LoRA, loraB)
	}
}

// TestLoRADecodePick: a disaggregated adapter request prefers the decode
// pod running its adapter over a less loaded one.
func TestLoRADecodePick(t *testing.T) {
	c := pdCore(t, pdPool(), Options{})
	loraScrape(c, pdD1, []string{"x"}, 2)
	loraScrape(c, pdD2, nil, 2)
	c.SetMetrics(0, pdD1, podmetrics.Metrics{Known: podmetrics.Running | podmetrics.LoRA, Running: 3,
		LoRA: podmetrics.LoRAInfo{Running: []string{"x"}, MaxLoRA: 2}}, false)
	g := grantOne(t, c, 0, &Ticket{RawISL: 1000, Model: "x"})
	if g.Endpoints[0] != pdD1 {
		t.Errorf("decode pick %v, want %s where x runs", g.Endpoints, pdD1)
	}
	c.Release(g, EventFirstByte)
	c.Release(g, EventDone)
	for _, a := range []string{pdD1, pdD2, pdP1, pdP2} {
		if n := len(c.reg.byAddr[a].lora.ours); n != 0 {
			t.Errorf("%s still counts %d adapters of ours", a, n)
		}
	}
}
