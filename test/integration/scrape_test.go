//go:build unix

package integration

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

// statusBytesPerEndpoint is about what one endpoint adds to the status
// page (indented JSON).
const statusBytesPerEndpoint = 250

// sendBufferMax is the most the kernel buffers on the picker's side of a
// connection whose reader does not read: net.ipv4.tcp_wmem's maximum.
func sendBufferMax(t *testing.T) int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_wmem")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 3 {
			if n, err := strconv.Atoi(f[2]); err == nil {
				return n
			}
		}
	}
	t.Logf("tcp_wmem not readable (%v): assuming 4 MiB", err)
	return 4 << 20
}

// slowScrape is a scraper that asks for a page and then stops reading, as
// one behind a congested link does: with a page larger than the kernel's
// buffers, the picker's handler stays blocked writing it.
type slowScrape struct{ net.Conn }

// startSlowScrape sends GET path with a receive buffer of a few KiB and
// returns once the status line arrived, so the picker's handler is
// running and blocked behind it.
func startSlowScrape(t *testing.T, addr, path string) *slowScrape {
	t.Helper()
	d := net.Dialer{Timeout: launch.EventTimeout, Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1024) })
		if err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("slow scrape: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: picker\r\n\r\n", path); err != nil {
		t.Fatalf("slow scrape: %v", err)
	}
	if err := c.SetReadDeadline(time.Now().Add(launch.EventTimeout)); err != nil {
		t.Fatal(err)
	}
	status := make([]byte, len("HTTP/1.1 200"))
	if _, err := io.ReadFull(c, status); err != nil || string(status) != "HTTP/1.1 200" {
		t.Fatalf("slow scrape of %s: status %q %v", path, status, err)
	}
	return &slowScrape{c}
}

// TestMetricsScrapeBound: the metrics port and the status page's port
// serve at most MaxConcurrentScrapes (4) requests at once, /metrics and
// /debug/status together; one more gets 503 with Retry-After at once
// instead of a fifth copy of a large page in memory, and scrapes are
// served again when one finishes.
func TestMetricsScrapeBound(t *testing.T) {
	launch.CheckGoroutines(t)
	const bound = 4
	// Enough endpoints that the status page is twice what the kernel
	// buffers for a reader that does not read.
	n := max(20_000, 2*sendBufferMax(t)/statusBytesPerEndpoint)
	var args []string
	var chunk []string
	for i := range n {
		chunk = append(chunk, fmt.Sprintf("10.%d.%d.%d:8000", i>>16&255, i>>8&255, i&255))
		if len(chunk) == 4000 || i == n-1 { // an argument stays below the kernel's 128 KiB
			args = append(args, "--endpoints="+strings.Join(chunk, ","))
			chunk = chunk[:0]
		}
	}
	p := startEPP(t, launch.EPPOptions{Args: args})

	addr := map[string]string{"/metrics": p.MetricsAddr, "/debug/status": p.StatusAddr}
	var held []*slowScrape
	for i := range bound {
		path := "/debug/status"
		if i%2 == 1 {
			path = "/metrics"
		}
		held = append(held, startSlowScrape(t, addr[path], path))
	}
	client := &http.Client{Timeout: launch.EventTimeout}
	get := func(path string) (*http.Response, []byte) {
		t.Helper()
		resp, err := client.Get("http://" + addr[path] + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		return resp, body
	}
	for _, path := range []string{"/metrics", "/debug/status"} {
		resp, body := get(path)
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Errorf("GET %s with %d scrapes in progress: %s retry-after %q (%d bytes), want 503 with Retry-After",
				path, bound, resp.Status, resp.Header.Get("Retry-After"), len(body))
		}
	}

	held[0].Close()
	var size int
	launch.WaitFor(t, func() string { return "no scrape served after one of the slow ones went away" }, func() bool {
		resp, body := get("/debug/status")
		size = len(body)
		return resp.StatusCode == http.StatusOK
	})
	if want := sendBufferMax(t); size <= want {
		t.Errorf("status page of %d bytes is not above the %d bytes the kernel may buffer: the slow scrapes were not slow", size, want)
	}
	if resp, _ := get("/metrics"); resp.StatusCode != http.StatusOK {
		t.Errorf("GET /metrics with %d slow scrapes left: %s, want 200", bound-1, resp.Status)
	}
}
