package launch

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
)

// pickerServing is the start of the line cmd/epp logs once it listens, in
// standalone and in Kubernetes mode, with its addresses as fields.
const pickerServing = "endpoint picker serving"

// Ports are the picker's listen ports; 0 lets the kernel choose one, which
// the launcher then reads from the picker's log.
type Ports struct {
	GRPC, Health, Metrics int
}

// EPPOptions describe one cmd/epp process: the flags the suites, the
// demo and the load tool set, and further flags in Args.
type EPPOptions struct {
	// Endpoints is --endpoints (standalone mode); empty passes none.
	Endpoints []string
	// Policy is --policy-config; empty keeps the synthetic default class.
	Policy string
	// TLS is --secure-serving (a self-signed certificate unless Args
	// names one); otherwise the ext_proc port is plaintext.
	TLS bool
	// Bind is --bind-address; empty is 127.0.0.1.
	Bind string
	// Ports are --grpc-port, --grpc-health-port and --metrics-port.
	Ports Ports
	// SkipReady returns from the start once the picker listens, without
	// waiting for its readiness service: for a test of readiness itself.
	SkipReady bool
	// Args are further flags, after the launcher's own: for a flag given
	// twice the last value wins, so Args may override any of the above
	// (the picker's log line tells the launcher what it bound).
	Args []string
	// Proc holds the options every start takes.
	Proc ProcOptions
}

// EPP is a running cmd/epp.
type EPP struct {
	*Proc
	// GRPCAddr, HealthAddr and MetricsAddr are the ext_proc, gRPC health
	// and Prometheus addresses the picker logged.
	GRPCAddr, HealthAddr, MetricsAddr string
	// StatusAddr is the status page's address (/debug/status, on the
	// loopback address unless --status-bind says otherwise); "" when the
	// picker serves none.
	StatusAddr string
	// Ports are the ports of those addresses.
	Ports Ports
	// TLS reports whether the ext_proc port serves TLS, as logged.
	TLS bool
	// Metrics is the picker's /metrics page.
	Metrics Page

	bins Binaries
	opts EPPOptions
	t    TB // set by RunEPP: Restart watches the new process too
}

// StartEPP starts the picker and returns once it listens and, unless
// SkipReady, its readiness health service reports SERVING.
func (b Binaries) StartEPP(ctx context.Context, o EPPOptions) (*EPP, error) {
	bin, err := binary(b.Epp, CmdEpp)
	if err != nil {
		return nil, err
	}
	args := []string{
		"--bind-address=" + cmp.Or(o.Bind, "127.0.0.1"),
		"--grpc-port=" + strconv.Itoa(o.Ports.GRPC),
		"--grpc-health-port=" + strconv.Itoa(o.Ports.Health),
		"--metrics-port=" + strconv.Itoa(o.Ports.Metrics),
		// The status page's own listener on a port the kernel chooses,
		// so that pickers of parallel tests do not collide.
		"--status-port=0",
		"--secure-serving=" + strconv.FormatBool(o.TLS),
		// A picker on loopback has no endpoints controller to wait for
		// after SIGTERM: stop accepting at once, as before the delay
		// existed. A test of the delay passes its own in Args.
		"--shutdown-delay=0",
	}
	if len(o.Endpoints) > 0 {
		args = append(args, "--endpoints="+strings.Join(o.Endpoints, ","))
	}
	if o.Policy != "" {
		args = append(args, "--policy-config="+o.Policy)
	}
	args = append(args, o.Args...)
	proc, err := o.Proc.start(CmdEpp, bin, args)
	if err != nil {
		return nil, err
	}
	p := &EPP{Proc: proc, bins: b, opts: o}
	if err := p.learnAddrs(ctx); err != nil {
		proc.Kill()
		return nil, fmt.Errorf("%w\nargs: %v", err, args)
	}
	if !o.SkipReady {
		if err := p.WaitReady(ctx); err != nil {
			proc.Kill()
			return nil, fmt.Errorf("%w\nargs: %v\nlog:\n%s", err, args, proc.Log.Tail(8000))
		}
	}
	return p, nil
}

// learnAddrs reads the addresses from the picker's serving line.
func (p *EPP) learnAddrs(ctx context.Context) error {
	var line struct {
		GRPC, Health, Metrics, Status string
		TLS                           bool
	}
	if err := awaitFields(ctx, p.Proc, pickerServing, p.opts.Proc.readyTimeout(), &line); err != nil {
		return err
	}
	p.GRPCAddr, p.HealthAddr, p.MetricsAddr, p.StatusAddr, p.TLS = line.GRPC, line.Health, line.Metrics, line.Status, line.TLS
	for _, a := range []struct {
		addr string
		port *int
	}{{line.GRPC, &p.Ports.GRPC}, {line.Health, &p.Ports.Health}, {line.Metrics, &p.Ports.Metrics}} {
		_, port, err := net.SplitHostPort(a.addr)
		if err == nil {
			*a.port, err = strconv.Atoi(port)
		}
		if err != nil {
			return fmt.Errorf("%s: address %q of its serving line: %w", p.Name, a.addr, err)
		}
	}
	p.Metrics = PageAt(p.MetricsAddr)
	return nil
}

// RunEPP starts the picker for the test t (StartEPP, failing t on an
// error) and stops it at t's cleanup: SIGTERM, and t fails unless it exits
// 0 within the stop grace; after a failed test it ends with SIGQUIT for a
// goroutine dump. Either way a failure puts its log into the test log.
func (b Binaries) RunEPP(t TB, o EPPOptions) *EPP {
	t.Helper()
	p, err := b.StartEPP(context.Background(), o)
	if err != nil {
		t.Fatalf("start picker: %v", err)
	}
	p.t = t
	watch(t, p.Proc, o.Proc.stopGrace())
	return p
}

// WaitReady waits until the readiness health service reports SERVING (a
// watch, not a poll), within the ready timeout.
func (p *EPP) WaitReady(ctx context.Context) error {
	return WaitGRPCServing(ctx, p.Proc, p.HealthAddr, "readiness", nil, p.opts.Proc.readyTimeout())
}

// Restart stops the picker (SIGTERM; an exit other than 0 within the stop
// grace is an error) and starts it again with the same options on the same
// ports, as a replaced pod keeps its Service's. A picker of RunEPP has
// its successor watched by the same test.
func (p *EPP) Restart(ctx context.Context) (*EPP, error) {
	if err := p.Stop(p.opts.Proc.stopGrace()); err != nil {
		return nil, fmt.Errorf("restart: %w", err)
	}
	o := p.opts
	o.Ports = p.Ports
	np, err := p.bins.StartEPP(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("restart: %w", err)
	}
	if p.t != nil {
		np.t = p.t
		watch(p.t, np.Proc, o.Proc.stopGrace())
	}
	return np, nil
}

// Dial opens a gRPC connection to the ext_proc port, over TLS without
// verification when the picker serves TLS (as a gateway is configured for
// a self-signed picker).
func (p *EPP) Dial() (*grpc.ClientConn, error) {
	var creds credentials.TransportCredentials
	if p.TLS {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // self-signed test picker
	}
	return Dial(p.GRPCAddr, creds)
}

// Conn is Dial for the test t: the connection closes at t's cleanup.
func (p *EPP) Conn(t TB) *grpc.ClientConn {
	t.Helper()
	conn, err := p.Dial()
	if err != nil {
		t.Fatalf("%s: %v", p.Name, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// HealthConn is a plaintext connection to the health port for the test t,
// closed at t's cleanup.
func (p *EPP) HealthConn(t TB) *grpc.ClientConn {
	t.Helper()
	conn, err := Dial(p.HealthAddr, nil)
	if err != nil {
		t.Fatalf("%s health: %v", p.Name, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// Client is a gateway's ext_proc client over a new connection of t.
func (p *EPP) Client(t TB, o extprocclient.Options) *extprocclient.Client {
	t.Helper()
	return extprocclient.New(p.Conn(t), o)
}
