package ha

import (
	"context"
	"fmt"
	"testing"

	"github.com/laneway-dev/laneway/pkg/drr"
	"github.com/laneway-dev/laneway/pkg/policy"
	"github.com/laneway-dev/laneway/pkg/sched/schedtest"
)

// BenchmarkTicketRoundTrip is one request decided over the replica link,
// both replicas in this process on loopback with mutual TLS: the
// follower encodes and sends the ticket, the leader decodes it, its
// dispatcher grants it, the decision comes back, and the grant's first
// byte and done go back to the leader. Both sides' CPU is in the figure
// (cmd/loadgen --compare-tickets measures the leader's alone, in its own
// process); b.RunParallel keeps several tickets in flight, as concurrent
// streams do, so the link batches.
func BenchmarkTicketRoundTrip(b *testing.B) {
	for _, tokens := range []int{256, 32 * 1024} {
		b.Run(fmt.Sprintf("tokens=%d", tokens), func(b *testing.B) {
			ca := newCA(b, "replicas")
			never := lanePolicy(drr.NoLimit)
			never.Busy[0] = policy.BusyTest{} // nothing queues: the figure is the link's, not a queue's
			l := startLeaderOf(b, ca, never, ep)
			f := startFollower(b, ca, ep)
			f.follow(b, l)
			proto := schedtest.Ticket().Prompt(tokens).Obj()
			b.ReportAllocs()
			b.SetParallelism(16)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					tk := *proto
					g, err := f.c.Acquire(context.Background(), &tk)
					if err != nil {
						b.Error(err)
						return
					}
					g.FirstByte()
					g.Done()
				}
			})
			b.StopTimer()
			if got := f.routes(routeForwarded); got < float64(b.N)/2 {
				b.Fatalf("%v of %d requests went over the link", got, b.N)
			}
		})
	}
}
