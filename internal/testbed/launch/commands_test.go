package launch

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
)

// TestCommands builds the module's four commands and starts three as the suites do: a
// simulator, a TLS picker routing to it and the gateway in front, and
// checks what the launcher learnt (addresses from the log lines, TLS) by
// using it: a completion through the gateway, the picker's and the
// simulator's metrics, a restart on the same ports behind the same
// gateway, and a readiness wait skipped and then done.
func TestCommands(t *testing.T) {
	dir := t.TempDir()
	bins, err := Build(dir, false, CmdEpp, CmdModelsim, CmdGateway, CmdLaneway)
	if err != nil {
		t.Fatal(err)
	}
	if got := InDir(dir); got != bins {
		t.Errorf("InDir = %+v, want what Build made: %+v", got, bins)
	}
	s := bins.RunSim(t, SimOptions{Args: []string{"--time-per-output-token=1ms"}})
	p := bins.RunEPP(t, EPPOptions{Endpoints: []string{s.Addr}, TLS: true, Args: []string{"--drain-timeout=2s"}})
	if !p.TLS || p.Ports.GRPC == 0 || p.GRPCAddr != HostPort("127.0.0.1", p.Ports.GRPC) {
		t.Fatalf("picker %+v: want TLS and the ports it logged", p)
	}
	g := bins.RunGateway(t, GatewayOptions{EPP: p, Timeout: time.Minute})

	complete := func() {
		t.Helper()
		body := []byte(`{"model":"sim-model","prompt":[1,2,3],"max_tokens":2}`)
		resp, err := http.Post(g.URL+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("completion through the gateway: %s", resp.Status)
		}
	}
	complete()
	p.Metrics.Await(t, 1, "laneway_dispatches_total")
	if v := s.Metrics.Read(t).Names(); !containsPrefix(v, "vllm:") {
		t.Errorf("simulator metrics %q lack the vLLM series", v)
	}

	ports := p.Ports
	p, err = p.Restart(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if p.Ports != ports {
		t.Fatalf("restarted on %+v, want the old ports %+v", p.Ports, ports)
	}
	// The gateway reconnects to the new picker on the old address; a
	// counter of the new process starts again.
	WaitFor(t, func() string { return "a completion through the gateway after the restart" }, func() bool {
		resp, err := http.Post(g.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"sim-model","prompt":[1],"max_tokens":1}`))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	p.Metrics.Await(t, 1, "laneway_dispatches_total")

	// A second picker without waiting for readiness, then the wait.
	q := bins.RunEPP(t, EPPOptions{SkipReady: true, Proc: ProcOptions{Name: "epp-2"}})
	if q.Name != "epp-2" || q.HealthAddr == "" {
		t.Fatalf("picker %+v: want its name and addresses", q)
	}
	if err := q.WaitReady(context.Background()); err != nil {
		t.Fatal(err)
	}
	ex, err := q.Client(t, extprocclient.Options{}).Start(context.Background(), extprocclient.RequestSpec{Path: "/v1/completions", Body: []byte(`{"model":"m","prompt":"x"}`)})
	if err != nil {
		t.Fatalf("exchange with a picker of no endpoints: %v", err)
	}
	if d := ex.Decision(); d.Routed() || d.Immediate.Status != http.StatusServiceUnavailable {
		t.Errorf("picker of no endpoints decided %+v, want 503", d)
	}
	ex.Close()
}

// TestStartErrors: a missing binary and a picker that exits at once are
// errors that say so.
func TestStartErrors(t *testing.T) {
	if _, err := (Binaries{}).StartEPP(context.Background(), EPPOptions{}); err == nil || !strings.Contains(err.Error(), "no binary") {
		t.Errorf("StartEPP without a binary = %v", err)
	}
	// The test binary itself as the "picker": it exits 3 in this mode
	// without logging a serving line.
	t.Setenv(childEnv, "exit3")
	_, err := Binaries{Epp: os.Args[0]}.StartEPP(context.Background(), EPPOptions{})
	if err == nil || !strings.Contains(err.Error(), "exited before logging") || !strings.Contains(err.Error(), "child failing") {
		t.Errorf("StartEPP of a failing process = %v, want the exit and its log", err)
	}
}

func containsPrefix(names []string, prefix string) bool {
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			return true
		}
	}
	return false
}
