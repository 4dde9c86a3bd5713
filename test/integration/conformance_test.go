package integration

import (
	"net/http"
	"testing"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/pkg/extproc"
)

// TestConformanceHooks: the upstream conformance suite's request header
// test-epp-endpoint-selection pins a request to the endpoints it names,
// and the response then echoes the served endpoint in
// x-conformance-test-served-endpoint (SPEC §7). Any client could send the
// header, so both hooks are off unless --enable-conformance-hooks: the
// header is then an unknown header like any other, neither restricting
// the pick nor earning the echo (SPEC §15).
func TestConformanceHooks(t *testing.T) {
	launch.CheckGoroutines(t)
	bs := startBackends(t, 2)
	pool := addrs(bs)
	const outside = "127.0.0.99:9"

	cases := []struct {
		name  string
		args  []string
		pin   string
		route string // "": the request must be answered 503 no_endpoints
		echo  bool
	}{
		{name: "off by default: a pin outside the pool is ignored", pin: outside},
		{name: "off by default: no echo", pin: pool[1]},
		{name: "on: a pin outside the pool finds nothing", args: []string{"--enable-conformance-hooks"}, pin: outside, route: ""},
		{name: "on: pinned and echoed", args: []string{"--enable-conformance-hooks"}, pin: pool[1], route: pool[1], echo: true},
		{name: "explicitly off", args: []string{"--enable-conformance-hooks=false"}, pin: outside},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			on := len(tc.args) > 0 && tc.args[0] == "--enable-conformance-hooks"
			p := startEPP(t, launch.EPPOptions{Endpoints: pool, Args: tc.args})
			c := p.Client(t, extprocclient.Options{})
			ex := mustStart(t, c, spec(tokens(16, 1), extproc.HeaderTestEndpointSelection, tc.pin))
			if on && tc.route == "" {
				immediate(t, ex, http.StatusServiceUnavailable, "no_endpoints")
				return
			}
			got := mustRoute(t, ex)
			if on && got != tc.route {
				t.Fatalf("pinned to %s, routed to %s", tc.route, got)
			}
			if !on && got != pool[0] && got != pool[1] {
				t.Fatalf("routed to %s, not a pool endpoint %v", got, pool)
			}
			mut, err := ex.SendResponseHeaders(http.StatusOK, http.Header{"content-type": {"application/json"}}, true, "")
			if err != nil {
				t.Fatalf("response headers: %v", err)
			}
			served, has := mut.Get(extproc.HeaderConformanceServed)
			switch {
			case tc.echo && served != got:
				t.Errorf("%s = %q (present %t), want the pick %s", extproc.HeaderConformanceServed, served, has, got)
			case !tc.echo && has:
				t.Errorf("%s = %q with the hooks off", extproc.HeaderConformanceServed, served)
			}
			if err := ex.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}
		})
	}
}
