package sched_test

import (
	"fmt"
	"testing"

	"github.com/laneway-dev/laneway/pkg/podmetrics"
	"github.com/laneway-dev/laneway/pkg/sched"
	"github.com/laneway-dev/laneway/pkg/sched/schedtest"
)

// BenchmarkDecision is the core's whole work for one direct request of a
// 32k-token prompt over 100 (and 1,000) endpoints: cost snapshot (prefix
// overlap on every eligible endpoint), class resolution, busy test, offer,
// pick, charge and index record, then release. Body parsing and hashing
// are not included (pkg/tokenize and internal/epp measure them). Each op
// allocates its Request, as the live driver's pooled waiter does not.
func BenchmarkDecision(b *testing.B) {
	for _, c := range []struct{ endpoints, holders int }{{100, 0}, {100, 1}, {100, 100}, {1000, 1}} {
		holders := c.holders
		b.Run(fmt.Sprintf("endpoints=%d/holders=%d", c.endpoints, holders), func(b *testing.B) {
			var addrs []string
			for i := range c.endpoints {
				addrs = append(addrs, fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250+1))
			}
			core := sched.NewTestCore(b, sched.ByHeader(0, sched.FCFSClass("standard", 1, 0)),
				sched.Options{Chooser: sched.NewCostChooser(1, 1), Prefix: &sched.PrefixOptions{}}, addrs...)
			tk := schedtest.Ticket().Prompt(32768).Shared(32768).Obj()
			for i := range holders {
				core.RecordOn(i, tk.Blocks[:len(tk.Blocks)*(i+1)/holders], 16)
			}
			if holders == 0 {
				tk = schedtest.Ticket().Prompt(32768).Seed(2).Obj() // nothing of it anywhere
			}
			blocks := tk.Blocks
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				*tk = sched.Ticket{RawISL: 32768, Blocks: blocks, BlockSize: 16}
				sched.AdmitTicket(core, 0, tk)
				l := core.Drain(0)
				if len(l) != 1 || l[0].Grant == nil {
					b.Fatalf("decisions %v, want one grant", l)
				}
				core.Release(l[0].Grant, sched.EventDone)
			}
		})
	}
}

// BenchmarkUnchangedScrape is the loop's cost of one scrape that changes
// no busy input, with every one of 1,000 endpoints busy and 100 requests
// queued: SetMetrics alone (what the driver does now), and SetMetrics
// followed by the Drain the driver used to run after every command, which
// re-probes the queued heads against every endpoint.
func BenchmarkUnchangedScrape(b *testing.B) {
	for _, drain := range []bool{false, true} {
		b.Run(fmt.Sprintf("drain=%t", drain), func(b *testing.B) {
			var addrs []string
			for i := range 1000 {
				addrs = append(addrs, fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250+1))
			}
			core := sched.NewTestCore(b, sched.ByHeader(1, sched.FCFSClass("standard", 1, 0)), sched.Options{}, addrs...)
			for range len(addrs) + 100 { // one prefill each makes every endpoint busy; 100 wait
				sched.AdmitTicket(core, 0, &sched.Ticket{RawISL: 512})
			}
			if l := core.Drain(0); len(l) != len(addrs) {
				b.Fatalf("%d grants, want %d", len(l), len(addrs))
			}
			m := podmetrics.Metrics{Known: podmetrics.Waiting}
			core.SetMetrics(0, addrs[0], m, false)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if core.SetMetrics(0, addrs[0], m, false) {
					b.Fatal("an unchanged scrape reported a change")
				}
				if drain {
					if l := core.Drain(0); len(l) != 0 {
						b.Fatalf("%d decisions from an unchanged scrape", len(l))
					}
				}
			}
		})
	}
}
