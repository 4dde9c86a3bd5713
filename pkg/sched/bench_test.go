package sched

import (
	"fmt"
	"testing"
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
			core := newCore(b, byHeader(0, class("standard", 1, 0)), Options{Picker: NewCostPicker(1, 1), Prefix: &PrefixOptions{}}, addrs...)
			tk := promptTicket(32768, 32768, 1, 1, 16)
			for i := range holders {
				core.index.Record(int(core.reg.live[i]), tk.Blocks[:len(tk.Blocks)*(i+1)/holders], 16, 0)
			}
			if holders == 0 {
				tk = promptTicket(32768, 0, 0, 2, 16) // nothing of it anywhere
			}
			blocks := tk.Blocks
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				*tk = Ticket{RawISL: 32768, Blocks: blocks, BlockSize: 16}
				admit(core, 0, tk)
				l := core.Drain(0)
				if len(l) != 1 || l[0].Grant == nil {
					b.Fatalf("decisions %v, want one grant", l)
				}
				core.Release(l[0].Grant, EventDone)
			}
		})
	}
}
