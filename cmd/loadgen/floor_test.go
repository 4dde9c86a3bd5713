package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/internal/testbed/load"
)

// TestMain lets the test binary stand in for loadgen when spawnFloor runs
// it as the floor.
func TestMain(m *testing.M) {
	maybeServeFloor()
	os.Exit(m.Run())
}

// TestSpawnFloor starts the floor as --compare-floor does (this binary run
// again as a server of its own), warms it up and measures a short open
// loop against it, in cleartext and TLS; stopping it leaves no process.
func TestSpawnFloor(t *testing.T) {
	spawnedEndpoint = "127.0.0.7:8000"
	for _, secure := range []bool{false, true} {
		t.Run(map[bool]string{false: "cleartext", true: "tls"}[secure], func(t *testing.T) {
			f := &flags{tls: secure, conns: 1, warmup: 200 * time.Millisecond, tokens: 64, mode: "open", client: "h2", phases: true}
			ctx := context.Background()
			p, stop, err := spawnFloor(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			// With the response phases, and header-only (--response-phases=false):
			// each stream then ends with the answer, whatever the hold.
			for _, headerOnly := range []bool{false, true} {
				res, err := p.run(ctx, f, load.Config{Rate: 200, Hold: 10 * time.Millisecond, Duration: 250 * time.Millisecond, PromptTokens: 64, HeaderOnly: headerOnly})
				if err != nil {
					t.Fatal(err)
				}
				if res.Routed != 50 || res.Errors != 0 || !res.HasPickerCPU || res.PickerCPU <= 0 || res.HeaderOnly != headerOnly {
					t.Fatalf("header-only %t: result %+v, want 50 routed and the floor's CPU sampled", headerOnly, res)
				}
			}
		})
	}
}

// TestCompareLine: the summary names every side and puts Laneway's p99
// (the mean of its two runs) against the floor's.
func TestCompareLine(t *testing.T) {
	ms := time.Millisecond
	res := []load.Result{
		{Latency: load.Summary{P50: ms / 5, P99: 8 * ms / 10, Max: 5 * ms}},
		{Latency: load.Summary{P50: ms / 2, P99: 2 * ms, Max: 9 * ms}, Errors: 1},
		{Latency: load.Summary{P50: ms / 4, P99: 7 * ms / 10, Max: 4 * ms}},
		{Latency: load.Summary{P50: ms / 5, P99: ms, Max: 6 * ms}},
	}
	sides := []*picker{{name: "laneway"}, {name: "lwepp"}, {name: "floor"}, {name: "laneway"}}
	got := compareLine(sides, res, followerSide{})
	for _, want := range []string{
		"laneway p50 0.200/0.200 p99 0.800/1.000",
		"lwepp p50 0.500 p99 2.000 max 9.000 ms, CPU n/a",
		"floor p50 0.250 p99 0.700",
		"laneway above the floor: p50 -0.050 p99 +0.200 ms",
		"(errors 0/1/0/0)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("compare line %q lacks %q", got, want)
		}
	}
}
