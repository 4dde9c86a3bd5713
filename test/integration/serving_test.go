package integration

import (
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

// TestPprofBind: --pprof-port serves on the loopback address unless
// --pprof-bind names another, whatever --bind-address says: profiles
// expose the process's internals and must not reach the pod network by
// accident.
func TestPprofBind(t *testing.T) {
	const bind = "127.0.0.3" // the other servers' address, not 127.0.0.1
	tests := []struct {
		name           string
		args           []string
		serves, refuse string
	}{
		{name: "default", serves: "127.0.0.1", refuse: bind},
		{name: "explicit", args: []string{"--pprof-bind=" + bind}, serves: bind, refuse: "127.0.0.1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			launch.CheckGoroutines(t)
			port, err := launch.FreePortOnAll([]string{"127.0.0.1", bind})
			if err != nil {
				t.Skipf("loopback address %s not usable here: %v", bind, err)
			}
			p := startEPP(t, launch.EPPOptions{Bind: bind, Args: append([]string{"--pprof-port=" + strconv.Itoa(port)}, tc.args...)})
			if host, _, _ := net.SplitHostPort(p.MetricsAddr); host != bind {
				t.Fatalf("metrics on %s, want --bind-address %s", p.MetricsAddr, bind)
			}
			url := "http://" + launch.HostPort(tc.serves, port) + "/debug/pprof/cmdline"
			resp, err := (&http.Client{Timeout: launch.EventTimeout}).Get(url)
			if err != nil {
				t.Fatalf("pprof on %s: %v", tc.serves, err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("GET %s: %s", url, resp.Status)
			}
			if c, err := net.DialTimeout("tcp", launch.HostPort(tc.refuse, port), 2*time.Second); err == nil {
				c.Close()
				t.Errorf("pprof port %d also accepts connections on %s", port, tc.refuse)
			}
		})
	}
}

// TestStatusPageOnLoopback: the status page (tenant names, endpoint
// addresses) is not on the metrics port, which listens with the other
// servers and is in the chart's Service: it has a listener of its own on
// the loopback address (--status-bind, --status-port), reached with
// kubectl port-forward, whatever --bind-address says.
func TestStatusPageOnLoopback(t *testing.T) {
	const bind = "127.0.0.3" // the other servers' address, not 127.0.0.1
	launch.CheckGoroutines(t)
	p := startEPP(t, launch.EPPOptions{Bind: bind})
	client := &http.Client{Timeout: launch.EventTimeout}
	resp, err := client.Get("http://" + p.MetricsAddr + "/debug/status")
	if err != nil {
		t.Fatalf("GET /debug/status on the metrics port: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /debug/status on the metrics port %s: %s, want 404", p.MetricsAddr, resp.Status)
	}
	if host, _, _ := net.SplitHostPort(p.StatusAddr); host != "127.0.0.1" {
		t.Fatalf("status page on %q, want the loopback address", p.StatusAddr)
	}
	resp, err = client.Get("http://" + p.StatusAddr + "/debug/status")
	if err != nil {
		t.Fatalf("GET /debug/status on %s: %v", p.StatusAddr, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("GET /debug/status on %s: %s %q, want 200 JSON", p.StatusAddr, resp.Status, resp.Header.Get("Content-Type"))
	}
}
