package launch

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics is one parsed Prometheus text page: the picker's, a simulator's,
// or any other /metrics.
type Metrics struct {
	fams map[string]*dto.MetricFamily
}

// ParseMetrics parses a Prometheus text page with the Prometheus text
// parser.
func ParseMetrics(r io.Reader) (m Metrics, err error) {
	defer func() {
		// expfmt v0.67.5 panics on some malformed pages (pkg/podmetrics
		// keeps one as a test); a page that does is not a page.
		if r := recover(); r != nil {
			err = fmt.Errorf("parse metrics: the text parser panicked: %v", r)
		}
	}()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Metrics{}, fmt.Errorf("parse metrics: %w", err)
	}
	return Metrics{fams: fams}, nil
}

// scrapeClient bounds a scrape: a process whose loop is stuck may accept
// and never answer, and the caller should hear so instead of hanging.
var scrapeClient = &http.Client{Timeout: 10 * time.Second}

// Scrape GETs url and parses the page; anything but a 200 is an error.
func Scrape(ctx context.Context, url string) (Metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Metrics{}, fmt.Errorf("scrape %s: %w", url, err)
	}
	resp, err := scrapeClient.Do(req)
	if err != nil {
		return Metrics{}, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Metrics{}, fmt.Errorf("scrape %s: %s", url, resp.Status)
	}
	m, err := ParseMetrics(resp.Body)
	if err != nil {
		return Metrics{}, fmt.Errorf("%s: %w", url, err)
	}
	return m, nil
}

// Sum adds up the series called name whose labels include every pair of
// labels ("k1", "v1", "k2", "v2", ...); found is false when no series
// matched. name is a series name as Prometheus writes it: a counter's,
// gauge's or untyped metric's name, or a histogram's or summary's name
// with _count or _sum.
func (m Metrics) Sum(name string, labels ...string) (sum float64, found bool) {
	if len(labels)%2 != 0 {
		panic(fmt.Sprintf("metrics %s: label pairs %q have an odd count", name, labels))
	}
	f, value := m.series(name)
	if f == nil {
		return 0, false
	}
	for _, s := range f.GetMetric() {
		if hasLabels(s, labels) {
			found = true
			sum += value(s)
		}
	}
	return sum, found
}

// Value is Sum where an absent series reads 0 (a counter not yet
// incremented is not exported).
func (m Metrics) Value(name string, labels ...string) float64 {
	v, _ := m.Sum(name, labels...)
	return v
}

// LabelValues returns the values of label over the series of name, sorted
// (for a gauge with one series per endpoint: the endpoints).
func (m Metrics) LabelValues(name, label string) []string {
	var out []string
	for _, s := range m.fams[name].GetMetric() {
		for _, lp := range s.GetLabel() {
			if lp.GetName() == label {
				out = append(out, lp.GetValue())
			}
		}
	}
	slices.Sort(out)
	return out
}

// Family returns the parsed family called name (nil when absent), for a
// test of a page's shape, its types and label sets, rather than a value.
func (m Metrics) Family(name string) *dto.MetricFamily { return m.fams[name] }

// Names returns the metric family names of the page, sorted.
func (m Metrics) Names() []string {
	out := make([]string, 0, len(m.fams))
	for name := range m.fams {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// series finds the family holding the series called name and how to read
// one of its samples; nil when the page has no such series.
func (m Metrics) series(name string) (*dto.MetricFamily, func(*dto.Metric) float64) {
	if f, ok := m.fams[name]; ok {
		switch f.GetType() {
		case dto.MetricType_COUNTER, dto.MetricType_GAUGE, dto.MetricType_UNTYPED:
			return f, func(s *dto.Metric) float64 {
				return s.GetCounter().GetValue() + s.GetGauge().GetValue() + s.GetUntyped().GetValue()
			}
		}
		return nil, nil // a histogram's own name is no series
	}
	for _, suffix := range []string{"_count", "_sum"} {
		base, ok := strings.CutSuffix(name, suffix)
		f := m.fams[base]
		if !ok || f == nil {
			continue
		}
		count := suffix == "_count"
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			return f, func(s *dto.Metric) float64 {
				if count {
					return float64(s.GetHistogram().GetSampleCount())
				}
				return s.GetHistogram().GetSampleSum()
			}
		case dto.MetricType_SUMMARY:
			return f, func(s *dto.Metric) float64 {
				if count {
					return float64(s.GetSummary().GetSampleCount())
				}
				return s.GetSummary().GetSampleSum()
			}
		}
	}
	return nil, nil
}

// hasLabels reports whether s carries every pair of pairs.
func hasLabels(s *dto.Metric, pairs []string) bool {
	for i := 0; i+1 < len(pairs); i += 2 {
		if !slices.ContainsFunc(s.GetLabel(), func(lp *dto.LabelPair) bool {
			return lp.GetName() == pairs[i] && lp.GetValue() == pairs[i+1]
		}) {
			return false
		}
	}
	return true
}

// Page is a Prometheus text endpoint, "http://host:port/metrics", with the
// reads a test makes of it.
type Page string

// PageAt is the /metrics page of the server at addr ("host:port").
func PageAt(addr string) Page { return Page("http://" + addr + "/metrics") }

// Scrape reads the page.
func (p Page) Scrape(ctx context.Context) (Metrics, error) { return Scrape(ctx, string(p)) }

// Read scrapes the page for t and fails t when that fails.
func (p Page) Read(t TB) Metrics {
	t.Helper()
	m, err := p.Scrape(context.Background())
	if err != nil {
		t.Fatalf("%v", err)
	}
	return m
}

// Value is Metrics.Value of one fresh scrape.
func (p Page) Value(t TB, name string, labels ...string) float64 {
	t.Helper()
	return p.Read(t).Value(name, labels...)
}

// Await polls the page (metrics raise no event) until the series' sum is
// want, and returns; it fails t after EventTimeout with the last value.
func (p Page) Await(t TB, want float64, name string, labels ...string) {
	t.Helper()
	var got float64
	WaitFor(t, func() string { return fmt.Sprintf("%s%v = %v, want %v", name, labels, got, want) }, func() bool {
		got = p.Value(t, name, labels...)
		return got == want
	})
}
