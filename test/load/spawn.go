package load

import (
	"context"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/laneway-dev/laneway/internal/testproc"
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

	proc *testproc.Proc
}

// BuildEPP builds ./cmd/epp of the module around the working directory
// into dir and returns the binary's path.
func BuildEPP(dir string) (string, error) {
	return testproc.Build(dir, "./cmd/epp", false)
}

// spawnLogLimit bounds the picker output kept in memory for error
// messages; Log, when set, receives all of it.
const spawnLogLimit = 1 << 20

// Spawn starts the picker on free 127.0.0.1 ports and waits (up to 30 s)
// until its readiness health service reports SERVING.
func Spawn(ctx context.Context, o SpawnOptions) (*Proc, error) {
	ports, err := testproc.FreePorts("127.0.0.1", 3)
	if err != nil {
		return nil, err
	}
	p := &Proc{
		GRPCAddr:    testproc.HostPort("127.0.0.1", ports[0]),
		HealthAddr:  testproc.HostPort("127.0.0.1", ports[1]),
		MetricsAddr: testproc.HostPort("127.0.0.1", ports[2]),
	}
	args := append([]string{
		"--bind-address=127.0.0.1",
		"--grpc-port=" + strconv.Itoa(ports[0]),
		"--grpc-health-port=" + strconv.Itoa(ports[1]),
		"--metrics-port=" + strconv.Itoa(ports[2]),
		"--endpoints=" + strings.Join(o.Endpoints, ","),
		"--secure-serving=" + strconv.FormatBool(o.TLS),
	}, o.Args...)
	p.proc, err = testproc.Start(testproc.Options{Name: "picker", Bin: o.Bin, Args: args, LogLimit: spawnLogLimit, Output: o.Log})
	if err != nil {
		return nil, err
	}
	p.Cmd = p.proc.Cmd
	if err := testproc.WaitGRPCServing(ctx, p.proc, p.HealthAddr, "readiness", nil, 30*time.Second); err != nil {
		p.proc.Kill()
		return nil, err
	}
	return p, nil
}

// CPU samples the picker's CPU time from /proc.
func (p *Proc) CPU() CPUSampler { return ProcCPU(p.Cmd.Process.Pid) }

// Stop sends SIGTERM and waits up to timeout for a clean exit (then ends
// the picker with SIGQUIT for a goroutine dump, or SIGKILL).
func (p *Proc) Stop(timeout time.Duration) error {
	return p.proc.Stop(timeout)
}
