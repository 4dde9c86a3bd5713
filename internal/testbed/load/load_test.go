package load

import (
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

func TestSummarize(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	cases := []struct {
		name string
		in   []time.Duration
		want Summary
	}{
		{"empty", nil, Summary{}},
		{"one", ms(7), Summary{N: 1, P50: 7 * time.Millisecond, P90: 7 * time.Millisecond, P99: 7 * time.Millisecond, Max: 7 * time.Millisecond, Mean: 7 * time.Millisecond}},
		{"unsorted ten", ms(10, 1, 9, 2, 8, 3, 7, 4, 6, 5), Summary{N: 10, P50: 5 * time.Millisecond, P90: 9 * time.Millisecond, P99: 10 * time.Millisecond, Max: 10 * time.Millisecond, Mean: 5500 * time.Microsecond}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Summarize(tc.in); got != tc.want {
				t.Errorf("Summarize = %+v, want %+v", got, tc.want)
			}
		})
	}
	// Nearest rank over 1..1000: p99 is the 990th value.
	var many []time.Duration
	for i := 1000; i >= 1; i-- {
		many = append(many, time.Duration(i))
	}
	if s := Summarize(many); s.P50 != 500 || s.P90 != 900 || s.P99 != 990 || s.Max != 1000 {
		t.Errorf("1..1000: %+v", s)
	}
}

func TestConfigValidate(t *testing.T) {
	ok := Config{Rate: 1000, Concurrency: 10, Hold: time.Second, Duration: 10 * time.Second, PromptTokens: 256}
	cases := []struct {
		name    string
		mutate  func(*Config)
		closed  bool
		wantErr string
	}{
		{"open ok", func(*Config) {}, false, ""},
		{"closed ok", func(*Config) {}, true, ""},
		{"zero rate", func(c *Config) { c.Rate = 0 }, false, "rate"},
		{"rate too high", func(c *Config) { c.Rate = MaxRate + 1 }, false, "rate"},
		{"too many requests", func(c *Config) { c.Rate = MaxRate; c.Duration = MaxDuration }, false, "requests"},
		{"no duration", func(c *Config) { c.Duration = 0 }, false, "duration"},
		{"endless", func(c *Config) { c.Duration = time.Hour }, true, "duration"},
		{"negative hold", func(c *Config) { c.Hold = -1 }, false, "hold"},
		{"zero concurrency", func(c *Config) { c.Concurrency = 0 }, true, "concurrency"},
		{"no prompt", func(c *Config) { c.PromptTokens = 0 }, true, "prompt"},
		{"cap too high", func(c *Config) { c.ConcurrencyCap = MaxConcurrency + 1 }, false, "cap"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.mutate(&c)
			err := c.Validate(tc.closed)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("unexpected error %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("error %v, want one mentioning %q", err, tc.wantErr)
			}
		})
	}
}

func TestProcCPU(t *testing.T) {
	// Burn a little CPU so the reading is not trivially zero.
	x := 0
	for i := 0; i < 50_000_000; i++ {
		x += i % 7
	}
	v, err := ProcCPU(os.Getpid())()
	if err != nil || v <= 0 || x == 0 {
		t.Fatalf("ProcCPU(self) = %v, %v; want a positive reading", v, err)
	}
	if _, err := ProcCPU(1 << 30)(); err == nil {
		t.Error("ProcCPU of a missing process did not fail")
	}
}

// bins holds the real picker, built once by TestMain.
var bins launch.Binaries

func TestMain(m *testing.M) {
	launch.BuildAndRun(m, &bins, "load-test", false, launch.CmdEpp)
}

// startPicker runs a plaintext picker with endpoints for the test and a
// runner over one connection to it.
func startPicker(t *testing.T, endpoints ...string) (*launch.EPP, *Runner) {
	t.Helper()
	p := bins.RunEPP(t, launch.EPPOptions{Endpoints: endpoints})
	return p, &Runner{Clients: []*extprocclient.Client{p.Client(t, extprocclient.Options{})}, PickerCPU: ProcCPU(p.Cmd.Process.Pid)}
}

// idleEndpoint starts an idle stand-in model server for the test.
func idleEndpoint(t *testing.T) string {
	t.Helper()
	e, err := StartIdleEndpoint()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e.Addr()
}

func TestIdleEndpoint(t *testing.T) {
	addr := idleEndpoint(t)
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "vllm:num_requests_waiting{model_name=\"loadgen\"} 0") {
		t.Errorf("GET /metrics: %d %q", resp.StatusCode, body)
	}
	resp, err = http.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /v1/completions: %d, want no model service", resp.StatusCode)
	}
}

// TestRunOpen runs a short open loop against the real picker: every
// arrival is sent on schedule, routed, held and completed, and the report
// adds up.
func TestRunOpen(t *testing.T) {
	_, r := startPicker(t, idleEndpoint(t))
	res, err := r.RunOpen(context.Background(), Config{Rate: 200, Hold: 20 * time.Millisecond, Duration: 500 * time.Millisecond, PromptTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res.String())
	if res.Started != 100 || res.Routed != 100 || res.Errors != 0 || res.Skipped != 0 || res.Latency.N != 100 {
		t.Errorf("started %d routed %d errors %d skipped %d latencies %d; want 100 routed", res.Started, res.Routed, res.Errors, res.Skipped, res.Latency.N)
	}
	l := res.Latency
	if !(0 < l.P50 && l.P50 <= l.P90 && l.P90 <= l.P99 && l.P99 <= l.Max) {
		t.Errorf("latency summary out of order: %+v", l)
	}
	if !res.HasPickerCPU || res.PickerCPU < 0 || res.DecisionsPerSec <= 0 {
		t.Errorf("picker CPU %v (%v), decisions/s %v", res.PickerCPU, res.HasPickerCPU, res.DecisionsPerSec)
	}
}

// TestRunOpenCap: arrivals that find the cap reached are skipped, not
// delayed, so the schedule stays open-loop.
func TestRunOpenCap(t *testing.T) {
	_, r := startPicker(t, idleEndpoint(t))
	res, err := r.RunOpen(context.Background(), Config{Rate: 100, Hold: 200 * time.Millisecond, Duration: 500 * time.Millisecond, ConcurrencyCap: 1, PromptTokens: 8})
	if err != nil {
		t.Fatal(err)
	}
	if res.Started+res.Skipped != 50 || res.Skipped == 0 || res.PeakOpen != 1 || res.Routed != res.Started {
		t.Errorf("started %d skipped %d peak %d routed %d; want 50 arrivals, one stream at a time", res.Started, res.Skipped, res.PeakOpen, res.Routed)
	}
}

// TestRunClosed keeps N streams busy and counts the picker's direct
// answers by status (no endpoints: 503).
func TestRunClosed(t *testing.T) {
	t.Run("routed", func(t *testing.T) {
		_, r := startPicker(t, idleEndpoint(t))
		res, err := r.RunClosed(context.Background(), Config{Concurrency: 4, Duration: 300 * time.Millisecond, PromptTokens: 16})
		if err != nil {
			t.Fatal(err)
		}
		if res.Routed == 0 || res.Errors != 0 || res.PeakOpen > 4 || res.Routed != res.Latency.N {
			t.Errorf("routed %d errors %d peak %d latencies %d", res.Routed, res.Errors, res.PeakOpen, res.Latency.N)
		}
	})
	t.Run("no endpoints", func(t *testing.T) {
		_, r := startPicker(t)
		res, err := r.RunClosed(context.Background(), Config{Concurrency: 2, Duration: 200 * time.Millisecond, PromptTokens: 16})
		if err != nil {
			t.Fatal(err)
		}
		if res.Routed != 0 || res.Immediate == 0 || res.ByStatus[503] != res.Immediate {
			t.Errorf("routed %d immediate %d by status %v; want only 503s", res.Routed, res.Immediate, res.ByStatus)
		}
	})
}

// TestRunHeaderOnly: with header-only clients the picker ends each stream
// after its answer, so the run does not wait out the hold; a run whose
// clients do not match its Config is refused.
func TestRunHeaderOnly(t *testing.T) {
	p, envoy := startPicker(t, idleEndpoint(t))
	skip := &Runner{Clients: []*extprocclient.Client{p.Client(t, extprocclient.Options{Shape: extprocclient.EnvoySkip})}}
	cfg := Config{Rate: 100, Hold: MaxHold, Duration: 500 * time.Millisecond, PromptTokens: 16, HeaderOnly: true}
	res, err := skip.RunOpen(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Routed != 50 || res.Errors != 0 || !res.HeaderOnly || !strings.Contains(res.String(), "header-only") {
		t.Fatalf("result %+v, want 50 routed header-only", res)
	}
	if _, err := envoy.RunOpen(context.Background(), cfg); err == nil {
		t.Error("a header-only run with clients that play the response phases was not refused")
	}
	if _, err := skip.RunClosed(context.Background(), Config{Concurrency: 1, Duration: time.Second, PromptTokens: 16}); err == nil {
		t.Error("a run with response phases and header-only clients was not refused")
	}
}
