package load

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/pprof"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestSoakAgainstPicker: a short soak through the real picker answers
// every request exactly once, runs its actions and samples on their
// schedules, and finds the picker's goroutines back where they were.
func TestSoakAgainstPicker(t *testing.T) {
	eps := []string{idleEndpoint(t), idleEndpoint(t)}
	p, _ := startPicker(t, eps...)
	// The picker's scrapes keep a connection to each endpoint (two
	// goroutines each): count the goroutines before the soak only once
	// both exist, or the count after it has them and the one before not.
	for _, ep := range eps {
		p.Metrics.Await(t, 0, "laneway_endpoint_metrics_stale", "endpoint", ep)
	}
	var churns atomic.Int32
	k := &Soak{
		Addr:    p.GRPCAddr,
		Headers: []http.Header{{"x-laneway-policy-class": {"a"}}, {"x-laneway-policy-class": {"b"}}},
		Sample:  PickerSample(p.MetricsAddr),
		Actions: []Action{
			{Name: "churn", Every: 200 * time.Millisecond, Do: func(_ context.Context, n int) error {
				churns.Add(1)
				if n == 1 {
					return errors.New("the second churn fails")
				}
				return nil
			}},
		},
	}
	res, err := k.Run(context.Background(), SoakConfig{
		Rate: 200, Hold: 20 * time.Millisecond, Duration: 1500 * time.Millisecond, PromptTokens: 64,
		// Settle returns as soon as the goroutines are back; the bound is
		// for a loaded machine, where closing the load's connections and
		// streams took longer than 10 s under make test.
		SampleEvery: 500 * time.Millisecond, Settle: 30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Load.Started != 300 || res.Load.Routed != 300 || !res.ExactlyOnce() || res.Failed != 0 {
		t.Fatalf("sent %d, routed %d, answered once %d (%+v), want 300 each\n%s", res.Load.Started, res.Load.Routed, res.AnsweredOnce, res, res.String(0))
	}
	if got := p.Metrics.Value(t, "laneway_extproc_streams_total", "outcome", "routed"); got != 300 {
		t.Errorf("the picker counted %v routed streams, want 300", got)
	}
	if a := res.Actions["churn"]; a.Runs < 5 || a.Runs != int(churns.Load()) || a.Errors != 1 || !strings.Contains(a.FirstError, "second churn") {
		t.Errorf("churn action %+v after %d calls, want at least 5 runs and the one error", a, churns.Load())
	}
	if len(res.Samples) < 3 || res.SampleErrors != 0 || res.End().RSSBytes <= 0 || res.End().Goroutines <= 0 {
		t.Errorf("samples %+v (%d failed), want at least 3 with RSS and goroutines", res.Samples, res.SampleErrors)
	}
	if res.After.Streams-res.Before.Streams != 300 {
		t.Errorf("the samples count %v streams before and %v after, want 300 between", res.Before.Streams, res.After.Streams)
	}
	if res.After.Goroutines > res.Before.Goroutines+2 {
		t.Errorf("picker goroutines %d before, %d after the soak", res.Before.Goroutines, res.After.Goroutines)
	}
	for _, want := range []string{"exactly once: 300 of 300", "action churn:", "picker goroutines:"} {
		if !strings.Contains(res.String(0), want) {
			t.Errorf("report lacks %q:\n%s", want, res.String(0))
		}
	}
}

func TestSoakCount(t *testing.T) {
	tests := []struct {
		name string
		c    tagCount
		want SoakResult
	}{
		{"clean", tagCount{started: true, answers: 1, ends: 1}, SoakResult{AnsweredOnce: 1}},
		{"answered twice", tagCount{started: true, answers: 2, ends: 1, failed: true}, SoakResult{AnsweredTwice: 1, Failed: 1}},
		{"never answered", tagCount{started: true, ends: 1, failed: true}, SoakResult{Unanswered: 1, Failed: 1}},
		{"lost", tagCount{started: true}, SoakResult{Unanswered: 1, Unended: 1}},
		{"ended twice", tagCount{started: true, answers: 1, ends: 2}, SoakResult{EndedTwice: 1}},
		{"answered, then failed", tagCount{started: true, answers: 1, ends: 1, failed: true}, SoakResult{Failed: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got SoakResult
			got.count(tc.c)
			if got.AnsweredOnce != tc.want.AnsweredOnce || got.Unanswered != tc.want.Unanswered || got.AnsweredTwice != tc.want.AnsweredTwice ||
				got.Unended != tc.want.Unended || got.EndedTwice != tc.want.EndedTwice || got.Failed != tc.want.Failed {
				t.Errorf("count %+v = %+v, want %+v", tc.c, got, tc.want)
			}
		})
	}
}

func TestSoakRSSSlope(t *testing.T) {
	r := SoakResult{Samples: []Sample{
		{At: 0, RSSBytes: 999}, // before warm: ignored
		{At: time.Hour, RSSBytes: 100}, {At: 2 * time.Hour, RSSBytes: 300}, {At: 3 * time.Hour, RSSBytes: 500},
	}}
	if got := r.RSSSlope(time.Hour); got != 200 {
		t.Errorf("slope %v bytes/h, want 200", got)
	}
	if w := r.Warm(90 * time.Minute); w.At != 2*time.Hour {
		t.Errorf("warm sample at %s, want 2h", w.At)
	}
	if p := r.Peak(); p.RSSBytes != 999 {
		t.Errorf("peak %v", p.RSSBytes)
	}
}

// TestProfileGoroutines reads the total of a goroutine profile and keeps
// the profile where it was asked to.
func TestProfileGoroutines(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	dir := t.TempDir()
	before, after := filepath.Join(dir, "before.txt"), filepath.Join(dir, "after.txt")
	count := ProfileGoroutines(strings.TrimPrefix(srv.URL, "http://"), before, after)
	for _, isAfter := range []bool{false, true} {
		n, err := count(context.Background(), isAfter)
		if err != nil {
			t.Fatal(err)
		}
		if n < 2 || n > runtime.NumGoroutine()+10 {
			t.Errorf("goroutine total %d; this process has about %d", n, runtime.NumGoroutine())
		}
	}
	for _, p := range []string{before, after} {
		if b, err := os.ReadFile(p); err != nil || !strings.HasPrefix(string(b), "goroutine profile: total ") {
			t.Errorf("%s: %.40q %v", p, b, err)
		}
	}
}
