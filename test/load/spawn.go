package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// SpawnOptions describe a picker subprocess.
type SpawnOptions struct {
	// Bin is the epp binary.
	Bin string
	// TLS keeps --secure-serving (self-signed); otherwise plaintext.
	TLS bool
	// Endpoints is --endpoints.
	Endpoints []string
	// Args are further flags (e.g. --pprof-port).
	Args []string
	// Log receives the picker's output; nil discards it.
	Log io.Writer
}

// Proc is a running picker subprocess.
type Proc struct {
	// Cmd is the started process.
	Cmd *exec.Cmd
	// GRPCAddr, HealthAddr and MetricsAddr are its ext_proc, gRPC health
	// and Prometheus addresses.
	GRPCAddr, HealthAddr, MetricsAddr string

	exited chan struct{} // closed once the process has been reaped
}

// BuildEPP builds ./cmd/epp of the module around the working directory
// into dir and returns the binary's path.
func BuildEPP(dir string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "epp")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/epp")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build ./cmd/epp in %s: %w\n%s", root, err, b)
	}
	return out, nil
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find module root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("find module root: no go.mod above the working directory; run inside the repository or pass the epp binary")
		}
		dir = parent
	}
}

// Spawn starts the picker on free 127.0.0.1 ports and waits (up to 30 s)
// until its readiness health service reports SERVING.
func Spawn(ctx context.Context, o SpawnOptions) (*Proc, error) {
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	p := &Proc{
		GRPCAddr:    net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])),
		HealthAddr:  net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1])),
		MetricsAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[2])),
		exited:      make(chan struct{}),
	}
	args := append([]string{
		"--bind-address=127.0.0.1",
		"--grpc-port=" + strconv.Itoa(ports[0]),
		"--grpc-health-port=" + strconv.Itoa(ports[1]),
		"--metrics-port=" + strconv.Itoa(ports[2]),
		"--endpoints=" + strings.Join(o.Endpoints, ","),
		"--secure-serving=" + strconv.FormatBool(o.TLS),
	}, o.Args...)
	p.Cmd = exec.Command(o.Bin, args...)
	p.Cmd.Stdout, p.Cmd.Stderr = o.Log, o.Log
	if err := p.Cmd.Start(); err != nil {
		return nil, fmt.Errorf("exec %s: %w", o.Bin, err)
	}
	go func() {
		_ = p.Cmd.Wait() // read through Cmd.ProcessState
		close(p.exited)
	}()
	if err := p.waitReady(ctx); err != nil {
		_ = p.Cmd.Process.Kill()
		<-p.exited
		return nil, err
	}
	return p, nil
}

func freePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("probe a free port: %w", err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func (p *Proc) waitReady(ctx context.Context) error {
	conn, err := grpc.NewClient(p.HealthAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.5, MaxDelay: 200 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		return fmt.Errorf("dial picker health %s: %w", p.HealthAddr, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	go func() {
		select {
		case <-p.exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: "readiness"}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("watch picker readiness: %w", err)
	}
	for {
		st, err := w.Recv()
		if err != nil {
			return fmt.Errorf("picker not ready (exit state %v): %w", p.Cmd.ProcessState, err)
		}
		if st.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
	}
}

// CPU samples the picker's CPU time from /proc.
func (p *Proc) CPU() CPUSampler { return ProcCPU(p.Cmd.Process.Pid) }

// Stop sends SIGTERM and waits up to timeout for a clean exit.
func (p *Proc) Stop(timeout time.Duration) error {
	select {
	case <-p.exited:
	default:
		_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-p.exited:
	case <-time.After(timeout):
		_ = p.Cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("picker did not exit within %s of SIGTERM; killed", timeout)
	}
	if st := p.Cmd.ProcessState; st.ExitCode() != 0 {
		return fmt.Errorf("picker exited with %s", st)
	}
	return nil
}
