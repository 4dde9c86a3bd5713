package simulate

import (
	"testing"

	"github.com/laneway-dev/laneway/pkg/engine"
	"github.com/laneway-dev/laneway/pkg/policy"
)

// BenchmarkRun simulates 100,000 requests of two classes on 64 servers
// near saturation, per policy kind; it reports simulated requests per
// second of wall time and the core's share.
func BenchmarkRun(b *testing.B) {
	tr, err := Generate("class=interactive,rate=1600,prompt=100-800,output=~100,count=80000;class=batch,rate=400,prompt=1000-4000,output=~200,count=20000", 1)
	if err != nil {
		b.Fatal(err)
	}
	f, _ := NewFleet(64, engine.DefaultConfig())
	cfg, err := policy.LoadYAML([]byte(`policy_classes:
  - {name: interactive, queue_policy: fcfs, quantum: 3000, prefill_busy_threshold_frac: 1.0}
  - {name: batch, queue_policy: fcfs, quantum: 1000, prefill_busy_threshold_frac: 1.0}
default_policy_class: batch
`))
	if err != nil {
		b.Fatal(err)
	}
	for _, kind := range []string{PickerPrefix, PickerLeastLoaded} {
		b.Run(kind, func(b *testing.B) {
			p, err := NewPolicy("p", cfg, kind)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			var res *Result
			for b.Loop() {
				if res, err = Run(tr, f, p, Options{Seed: 1}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(tr.Requests))/res.Wall.Seconds(), "requests/s")
			b.ReportMetric(float64(res.CoreTime.Nanoseconds())/float64(res.Decisions), "core-ns/decision")
		})
	}
}
