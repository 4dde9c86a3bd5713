package launch

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// page is a Prometheus text page with every type the reader reads.
const page = `# TYPE laneway_dispatches_total counter
laneway_dispatches_total{policy_class="premium",queued="false"} 2
laneway_dispatches_total{policy_class="premium",queued="true"} 1
laneway_dispatches_total{policy_class="regular",queued="true"} 4
# TYPE laneway_endpoint_active_prefill_tokens gauge
laneway_endpoint_active_prefill_tokens{endpoint="127.0.0.3:8000"} 0
laneway_endpoint_active_prefill_tokens{endpoint="127.0.0.2:8000"} 512
# TYPE vllm:num_requests_waiting untyped
vllm:num_requests_waiting{model_name="m"} 3
# TYPE laneway_decision_seconds histogram
laneway_decision_seconds_bucket{le="0.001"} 6
laneway_decision_seconds_bucket{le="+Inf"} 7
laneway_decision_seconds_sum 0.25
laneway_decision_seconds_count 7
# TYPE rpc_seconds summary
rpc_seconds{quantile="0.5"} 0.1
rpc_seconds_sum 3
rpc_seconds_count 9
`

func TestMetricsSum(t *testing.T) {
	m, err := ParseMetrics(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		labels    []string
		want      float64
		wantFound bool
	}{
		{"laneway_dispatches_total", nil, 7, true},
		{"laneway_dispatches_total", []string{"policy_class", "premium"}, 3, true},
		{"laneway_dispatches_total", []string{"policy_class", "premium", "queued", "true"}, 1, true},
		{"laneway_dispatches_total", []string{"policy_class", "gold"}, 0, false},
		{"laneway_endpoint_active_prefill_tokens", []string{"endpoint", "127.0.0.3:8000"}, 0, true},
		{"laneway_endpoint_active_prefill_tokens", nil, 512, true},
		{"vllm:num_requests_waiting", nil, 3, true},
		{"laneway_decision_seconds_count", nil, 7, true},
		{"laneway_decision_seconds_sum", nil, 0.25, true},
		{"laneway_decision_seconds", nil, 0, false}, // a histogram's name is no series
		{"rpc_seconds_count", nil, 9, true},
		{"rpc_seconds_sum", nil, 3, true},
		{"absent_total", nil, 0, false},
		{"absent_total_count", nil, 0, false},
	}
	for _, tc := range tests {
		got, found := m.Sum(tc.name, tc.labels...)
		if got != tc.want || found != tc.wantFound {
			t.Errorf("Sum(%s, %q) = %v, %v; want %v, %v", tc.name, tc.labels, got, found, tc.want, tc.wantFound)
		}
		if v := m.Value(tc.name, tc.labels...); v != tc.want {
			t.Errorf("Value(%s, %q) = %v, want %v", tc.name, tc.labels, v, tc.want)
		}
	}
	if got, want := m.LabelValues("laneway_endpoint_active_prefill_tokens", "endpoint"), []string{"127.0.0.2:8000", "127.0.0.3:8000"}; !slices.Equal(got, want) {
		t.Errorf("LabelValues = %q, want %q", got, want)
	}
	if f := m.Family("rpc_seconds"); f == nil || len(f.GetMetric()) != 1 || m.Family("absent") != nil {
		t.Errorf("Family(rpc_seconds) = %v, Family(absent) = %v", f, m.Family("absent"))
	}
	if got := m.LabelValues("absent", "endpoint"); len(got) != 0 {
		t.Errorf("LabelValues of an absent family = %q", got)
	}
	want := []string{"laneway_decision_seconds", "laneway_dispatches_total", "laneway_endpoint_active_prefill_tokens", "rpc_seconds", "vllm:num_requests_waiting"}
	if got := m.Names(); !slices.Equal(got, want) {
		t.Errorf("Names = %q, want %q", got, want)
	}
}

func TestParseMetricsRejects(t *testing.T) {
	for _, bad := range []string{
		"laneway_x{a=\"b\" 1\n",
		"{a=\"b\",} 1\n", // makes expfmt v0.67.5 panic: an error here
	} {
		if _, err := ParseMetrics(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseMetrics(%q) accepted it", bad)
		}
	}
}

func TestMetricsSumOddLabels(t *testing.T) {
	m, err := ParseMetrics(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if recover() == nil {
			t.Error("Sum with an odd label list did not panic")
		}
	}()
	//lint:ignore SA5012 the call is wrong on purpose: it must panic
	m.Sum("laneway_dispatches_total", "policy_class")
}

// TestPage reads a page over HTTP: a value, a wait for a value that
// arrives after a few scrapes, and the failure messages of a wait that
// times out and of a page that answers 500.
func TestPage(t *testing.T) {
	var scrapes atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			n := scrapes.Add(1)
			w.Write([]byte("# TYPE x_total counter\nx_total " + map[bool]string{false: "1", true: "2"}[n >= 3] + "\n"))
		default:
			http.Error(w, "broken", http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	p := Page(srv.URL + "/metrics")
	if v := p.Value(t, "x_total"); v != 1 {
		t.Errorf("Value = %v, want 1", v)
	}
	p.Await(t, 2, "x_total")
	if n := scrapes.Load(); n != 3 {
		t.Errorf("%d scrapes, want 3 (the wait stops at the first match)", n)
	}

	f := runFake(func(tb *fakeTB) { Page(srv.URL + "/broken").Read(tb) })
	if len(f.errors) != 1 || !strings.Contains(f.errors[0], "500") {
		t.Errorf("errors %q, want the status named", f.errors)
	}
	if got := PageAt("127.0.0.1:9090"); got != "http://127.0.0.1:9090/metrics" {
		t.Errorf("PageAt = %q", got)
	}
}

// TestWatchMax: the watch keeps the largest value of every sample, the
// last one (taken at Stop) included.
func TestWatchMax(t *testing.T) {
	values := []string{"1", "5", "3"}
	var served atomic.Int32
	allServed := make(chan struct{})
	final := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		n := int(served.Add(1))
		v := "2"
		switch {
		case n <= len(values):
			v = values[n-1]
			if n == len(values) {
				close(allServed)
			}
		default:
			select {
			case <-final: // Stop's sample
				v = "7"
			default:
			}
		}
		_, _ = w.Write([]byte("# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} " + v + "\n"))
	}))
	defer srv.Close()
	w := Page(srv.URL).WatchMax(time.Millisecond, "vllm:num_requests_waiting")
	<-allServed
	if max, n := w.Max(); max != 5 || n < 2 {
		t.Errorf("Max() = %v after %d samples, want 5 once the 5 was served", max, n)
	}
	close(final)
	max, n, err := w.Stop()
	if err != nil || max != 7 || n < len(values)+1 {
		t.Errorf("Stop() = %v, %d samples, %v; want 7 (the last sample), at least %d samples, no error", max, n, err, len(values)+1)
	}
}
