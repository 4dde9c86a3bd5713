package integration

import (
	"net/http"
	"testing"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

// TestEndpointsFile: standalone, --endpoints-file names the endpoints (one
// ip:port per line, # comments) and the picker follows the file: a new
// version replaces the set, a version that does not parse is logged and
// the last good set stays, and an empty file leaves no endpoints.
func TestEndpointsFile(t *testing.T) {
	launch.CheckGoroutines(t)
	bs := startBackends(t, 2)
	path := writePolicy(t, "# the pool\n"+bs[0].addr+"\n")
	p := startEPP(t, launch.EPPOptions{Args: []string{"--endpoints-file=" + path, "--policy-poll-interval=20ms"}})
	c := p.Client(t, extprocclient.Options{})
	route := func() string {
		t.Helper()
		ex := mustStart(t, c, spec(tokens(16, 1)))
		defer ex.Close()
		return mustRoute(t, ex)
	}
	if got := route(); got != bs[0].addr {
		t.Fatalf("pick %s, want the file's %s", got, bs[0].addr)
	}

	replaceFile(t, path, "\n  "+bs[1].addr+"  # moved\n")
	p.WaitLog(t, "endpoints file reloaded")
	if got := route(); got != bs[1].addr {
		t.Fatalf("after the update: pick %s, want %s", got, bs[1].addr)
	}

	replaceFile(t, path, bs[0].addr+"\nnot-an-address\n")
	p.WaitLog(t, "endpoints file rejected")
	if got := route(); got != bs[1].addr {
		t.Fatalf("after a broken update: pick %s, want the last good %s", got, bs[1].addr)
	}

	replaceFile(t, path, "# drained\n")
	p.WaitLog(t, `"endpoints":0`)
	ex := mustStart(t, c, spec(tokens(16, 2)))
	immediate(t, ex, http.StatusServiceUnavailable, "no_endpoints")
}
