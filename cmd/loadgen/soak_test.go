package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/internal/epp"
	"github.com/laneway-dev/laneway/internal/testbed/load"
	"github.com/laneway-dev/laneway/pkg/policy"
)

// TestSoakWorld: the churn rotates one endpoint per step through the ring
// in files the picker parses, and both policies load.
func TestSoakWorld(t *testing.T) {
	dir := t.TempDir()
	w := &soakWorld{endpoints: filepath.Join(dir, "endpoints"), policy: filepath.Join(dir, "policy.yaml"), n: 2,
		ring: []string{"127.0.0.2:1", "127.0.0.2:2", "127.0.0.2:3"}}
	for churns, want := range [][]string{{"127.0.0.2:1", "127.0.0.2:2"}, {"127.0.0.2:2", "127.0.0.2:3"}, {"127.0.0.2:3", "127.0.0.2:1"}, {"127.0.0.2:1", "127.0.0.2:2"}} {
		if err := w.writeEndpoints(churns); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(w.endpoints)
		if err != nil {
			t.Fatal(err)
		}
		got, err := epp.ParseEndpoints(data)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("after %d churns the file holds %v (%v), want %v", churns, got, err, want)
		}
	}
	for changes := range 2 {
		if err := w.writePolicy(changes); err != nil {
			t.Fatal(err)
		}
		cfg, err := policy.LoadFile(w.policy)
		if err == nil {
			_, err = cfg.Compile()
		}
		if err != nil {
			t.Errorf("soak policy %d: %v", changes, err)
		}
	}
}

func TestSoakVerdict(t *testing.T) {
	sk = soakFlags{maxGoroutineGrowth: 5, maxRSSGrowthMiB: 32}
	good := load.SoakResult{
		Load: load.Result{Started: 100}, AnsweredOnce: 100,
		Before: load.Sample{Goroutines: 40}, After: load.Sample{Goroutines: 42},
		Samples: []load.Sample{{At: time.Second, RSSBytes: 50 << 20}, {At: 2 * time.Second, RSSBytes: 60 << 20}},
	}
	if err := soakVerdict(&good, time.Second, 100, nil); err != nil {
		t.Fatalf("a clean soak: %v", err)
	}
	bad := good
	bad.AnsweredOnce, bad.After.Goroutines = 99, 50
	bad.Samples = []load.Sample{{At: time.Second, RSSBytes: 50 << 20}, {At: 2 * time.Second, RSSBytes: 90 << 20}}
	bad.Actions = map[string]load.ActionCount{"policy change": {Runs: 3, Errors: 1, FirstError: "disk full"}}
	err := soakVerdict(&bad, time.Second, 98, nil)
	for _, want := range []string{"1 of 100 requests were not answered exactly once", "counted 98 streams", "10 goroutines more", "grew 40.0 MiB", "policy change failed 1 times: disk full"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("verdict %v lacks %q", err, want)
		}
	}
}
