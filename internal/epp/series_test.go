package epp

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/pkg/sched"
)

// vllmPage is a model server's metrics page with the series the scraper
// needs.
const vllmPage = "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n"

// TestEndpointSeriesDeletedOnRemoval: once an endpoint leaves the pool its
// per-endpoint series (the core's gauges, the scraper's, the routed-token
// counters) leave /metrics; the remaining endpoint keeps its own. A pool
// whose pods come and go for months would otherwise export every address
// it ever had.
func TestEndpointSeriesDeletedOnRemoval(t *testing.T) {
	var eps []sched.Endpoint
	for range 2 {
		ms := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, vllmPage) }))
		t.Cleanup(ms.Close)
		eps = append(eps, sched.Endpoint{Addr: strings.TrimPrefix(ms.URL, "http://"), MaxBatchedTokens: 8192})
	}
	keep, gone := eps[0].Addr, eps[1].Addr
	s := newTestServer(t, func(o *Options) { o.Intel.ScrapeMetrics = true })
	s.Dispatcher().SetEndpoints(eps)
	s.SetReady(true)
	runServer(t, s)
	grpcAddr, _, metricsAddr := s.Addrs()
	page := launch.PageAt(metricsAddr)

	conn, err := launch.Dial(grpcAddr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := extprocclient.New(conn, extprocclient.Options{})
	for _, ep := range []string{keep, gone} {
		ex, err := c.Start(context.Background(), extprocclient.RequestSpec{
			Body: []byte(`{"model":"m","prompt":"hello there"}`), Subset: &extprocclient.SubsetHint{Endpoints: []string{ep}},
		})
		if err != nil || !ex.Decision().Routed() {
			t.Fatalf("route to %s: %v %+v", ep, err, ex.Decision().Immediate)
		}
		if _, _, err := ex.Respond(200, nil, []byte("ok")); err != nil {
			t.Fatal(err)
		}
		ex.Close()
	}

	perEndpoint := []string{
		"laneway_endpoint_active_prefill_tokens", "laneway_endpoint_in_flight_requests",
		"laneway_endpoint_unseen_waiting_requests", "laneway_endpoint_prefix_index_tokens",
		"laneway_endpoint_engine_waiting_requests", "laneway_endpoint_engine_running_requests",
		"laneway_endpoint_metrics_stale", "laneway_scrapes_total", "laneway_scrape_errors_total",
		"laneway_routed_prompt_tokens_total", "laneway_routed_cached_tokens_total",
		"laneway_endpoint_awaiting_engine_grants", "laneway_endpoint_others_on_their_way_tokens",
		"laneway_endpoint_prefill_rate_tokens_per_second", "laneway_endpoint_arrival_share",
	}
	both := []string{keep, gone}
	slices.Sort(both)
	seen := func(want []string) func() bool {
		return func() bool {
			m, err := page.Scrape(context.Background())
			if err != nil {
				return false
			}
			for _, name := range perEndpoint {
				if !slices.Equal(m.LabelValues(name, "endpoint"), want) {
					return false
				}
			}
			return true
		}
	}
	show := func() string {
		m := page.Read(t)
		var b strings.Builder
		for _, name := range perEndpoint {
			fmt.Fprintf(&b, "\n%s: %v", name, m.LabelValues(name, "endpoint"))
		}
		return b.String()
	}
	launch.WaitFor(t, func() string { return "series of both endpoints:" + show() }, seen(both))

	s.Dispatcher().SetEndpoints(eps[:1])
	launch.WaitFor(t, func() string { return "series of only " + keep + ":" + show() }, seen([]string{keep}))
}
