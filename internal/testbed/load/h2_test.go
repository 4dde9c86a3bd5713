package load

import (
	"context"
	"crypto/tls"
	"net/http"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

// TestH2RunnerAgainstPicker drives the real picker through the event-driven
// gateway: every request is routed, every stream completes its response
// phases, and the picker counts each stream once as routed.
func TestH2RunnerAgainstPicker(t *testing.T) {
	for _, tc := range []struct {
		name       string
		hold       time.Duration
		tokens     int
		headerOnly bool
	}{
		{"hold 50ms", 50 * time.Millisecond, 256, false},
		{"no hold", 0, 256, false},
		// 40k token ids are a ~240 kB body: four 62,000-byte messages, each
		// split into frames and paced by the picker's windows.
		{"large body", 10 * time.Millisecond, 40_000, false},
		// No response phases: the picker ends each stream after its
		// answer, so the run ends without waiting out the hold.
		{"header only", MaxHold, 256, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := startPicker(t, idleEndpoint(t))
			r := &H2Runner{Addr: p.GRPCAddr, Conns: 2, PickerCPU: ProcCPU(p.Cmd.Process.Pid)}
			res, err := r.RunOpen(context.Background(), Config{Rate: 400, Hold: tc.hold, Duration: 500 * time.Millisecond, PromptTokens: tc.tokens, HeaderOnly: tc.headerOnly})
			if err != nil {
				t.Fatal(err)
			}
			if res.Started != 200 || res.Routed != 200 || res.Errors != 0 || res.Immediate != 0 || res.Latency.N != 200 {
				t.Fatalf("result %+v, want 200 started and routed, no errors", res)
			}
			if res.Latency.P50 <= 0 || res.Latency.Max < res.Latency.P99 {
				t.Errorf("latency %+v", res.Latency)
			}
			if !res.HasPickerCPU || res.PickerCPU <= 0 {
				t.Errorf("no picker CPU measured: %+v", res)
			}
			if got := p.Metrics.Value(t, "laneway_extproc_streams_total", "outcome", "routed"); got != 200 {
				t.Errorf("picker counted %v routed streams, want 200", got)
			}
		})
	}
}

// TestH2RunnerImmediate: with no endpoints every request gets an immediate
// 503, counted by status, and no stream is left open.
func TestH2RunnerImmediate(t *testing.T) {
	p, _ := startPicker(t)
	r := &H2Runner{Addr: p.GRPCAddr, Conns: 1}
	res, err := r.RunOpen(context.Background(), Config{Rate: 200, Hold: time.Second, Duration: 250 * time.Millisecond, PromptTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	if res.Started != 50 || res.Immediate != 50 || res.ByStatus[http.StatusServiceUnavailable] != 50 || res.Errors != 0 {
		t.Fatalf("result %+v, want 50 immediate 503s", res)
	}
	if res.Elapsed > 5*time.Second {
		t.Errorf("run took %s: an immediate answer must not wait out the hold", res.Elapsed)
	}
}

// TestH2RunnerTLS speaks TLS with ALPN h2 to a picker serving its
// self-signed certificate.
func TestH2RunnerTLS(t *testing.T) {
	p := bins.RunEPP(t, launch.EPPOptions{TLS: true, Endpoints: []string{idleEndpoint(t)}})
	r := &H2Runner{Addr: p.GRPCAddr, Conns: 1, TLS: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // self-signed test picker
	res, err := r.RunOpen(context.Background(), Config{Rate: 200, Hold: 10 * time.Millisecond, Duration: 250 * time.Millisecond, PromptTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	if res.Routed != 50 || res.Errors != 0 {
		t.Fatalf("result %+v, want 50 routed", res)
	}
}

// TestH2RunnerPlaintextToTLSPicker: a handshake failure is an error from
// RunOpen, not a hang.
func TestH2RunnerPlaintextToTLSPicker(t *testing.T) {
	p := bins.RunEPP(t, launch.EPPOptions{TLS: true, Endpoints: []string{idleEndpoint(t)}})
	r := &H2Runner{Addr: p.GRPCAddr, Conns: 1}
	res, err := r.RunOpen(context.Background(), Config{Rate: 100, Hold: 0, Duration: 100 * time.Millisecond, PromptTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors != res.Started || res.Routed != 0 {
		t.Fatalf("result %+v: cleartext HTTP/2 to a TLS port must fail every stream", res)
	}
}
