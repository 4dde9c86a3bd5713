package replica

import (
	"testing"

	"github.com/laneway-dev/laneway/pkg/sched/schedtest"
)

// BenchmarkTicket is one ticket's encoding on the follower and decoding
// on the leader (the chain rebuilt and recycled, as the leader does), at
// the prompt lengths of docs/scaling.md.
func BenchmarkTicket(b *testing.B) {
	for _, tc := range []struct {
		name   string
		tokens int
	}{{"256", 256}, {"32k", 32 * 1024}} {
		tk := schedtest.Ticket().Prompt(tc.tokens).Obj()
		tk.Model, tk.Tenant = "meta-llama/Llama-3.1-8B-Instruct", "team-a"
		b.Run("encode/"+tc.name, func(b *testing.B) {
			buf := make([]byte, 0, 4096)
			b.ReportAllocs()
			for b.Loop() {
				buf = AppendTicket(buf[:0], 1, tk)
			}
			b.ReportMetric(float64(len(buf)), "bytes/ticket")
		})
		b.Run("decode/"+tc.name, func(b *testing.B) {
			data := AppendTicket(nil, 1, tk)
			var f Frame
			b.ReportAllocs()
			for b.Loop() {
				if err := f.Decode(data); err != nil {
					b.Fatal(err)
				}
				PutChain(f.Tickets[0].T.Blocks)
			}
		})
	}
}
