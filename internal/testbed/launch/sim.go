package launch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrAddrUnusable is wrapped by StartSim's error when its host address
// cannot be bound on this machine (a 127.0.0.x other than 127.0.0.1 on a
// system with only that one): RunSim skips the test then.
var ErrAddrUnusable = errors.New("address not usable here")

// SimOptions describe one cmd/modelsim process.
type SimOptions struct {
	// Host is --host; empty is 127.0.0.1.
	Host string
	// Port is --port; 0 takes one that is free on Host (and tries again
	// with another when a process takes it first).
	Port int
	// Args are further flags (the engine's shape: --max-num-seqs, ...).
	Args []string
	// Proc holds the options every start takes.
	Proc ProcOptions
}

// Sim is a running cmd/modelsim.
type Sim struct {
	*Proc
	// Addr is its "host:port"; URL is "http://" + Addr.
	Addr, URL string
	// Metrics is its /metrics page (the engine's vLLM series).
	Metrics Page
}

// simAttempts bounds the starts on a free port another process took.
const simAttempts = 3

// StartSim starts the simulator and returns once its /health answers 200.
func (b Binaries) StartSim(ctx context.Context, o SimOptions) (*Sim, error) {
	bin, err := binary(b.Modelsim, CmdModelsim)
	if err != nil {
		return nil, err
	}
	host := cmp.Or(o.Host, "127.0.0.1")
	for attempt := 1; ; attempt++ {
		port := o.Port
		if port == 0 {
			if port, err = FreePort(host); err != nil {
				return nil, fmt.Errorf("modelsim on %s: %w: %w", host, ErrAddrUnusable, err)
			}
		}
		s, err := startSim(ctx, bin, host, port, o)
		if err == nil || o.Port != 0 || attempt == simAttempts || !strings.Contains(err.Error(), "address already in use") {
			return s, err
		}
	}
}

func startSim(ctx context.Context, bin, host string, port int, o SimOptions) (*Sim, error) {
	addr := HostPort(host, port)
	args := append([]string{"--host=" + host, "--port=" + strconv.Itoa(port)}, o.Args...)
	proc, err := o.Proc.start(CmdModelsim+" "+addr, bin, args)
	if err != nil {
		return nil, err
	}
	s := &Sim{Proc: proc, Addr: addr, URL: "http://" + addr, Metrics: PageAt(addr)}
	if err := Poll(ctx, proc, proc.Name, o.Proc.readyTimeout(), HTTPOK(s.URL+"/health")); err != nil {
		proc.Kill()
		return nil, err
	}
	return s, nil
}

// RunSim starts the simulator for the test t and stops it at t's cleanup,
// as RunEPP does; it skips t when the host address is not usable here.
func (b Binaries) RunSim(t TB, o SimOptions) *Sim {
	t.Helper()
	s, err := b.StartSim(context.Background(), o)
	if errors.Is(err, ErrAddrUnusable) {
		t.Skipf("%v", err)
	}
	if err != nil {
		t.Fatalf("start modelsim: %v", err)
	}
	watch(t, s.Proc, o.Proc.stopGrace())
	return s
}
