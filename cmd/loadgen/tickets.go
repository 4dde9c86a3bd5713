package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spf13/pflag"

	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/internal/testbed/load"
	"github.com/laneway-dev/laneway/internal/tlsutil"
)

// ticketFlags are the flags of the side-by-side run of a full local
// decision and a ticket (docs/scaling.md): the spawned picker is the
// leader of a second spawned picker, a follower (--replica-leader), and
// every run goes to the leader directly, then through the follower, then
// to the leader again, with both processes' CPU read from /proc.
type ticketFlags struct {
	compare bool
	// replicaDir is the identity both spawned pickers use; replicaPort
	// the leader's replica link.
	replicaDir  string
	replicaPort int
}

// tk holds the parsed ticketFlags.
var tk ticketFlags

func (t *ticketFlags) register(fs *pflag.FlagSet) {
	fs.BoolVar(&t.compare, "compare-tickets", false,
		"with --spawn: also start a follower of the spawned picker (over the replica link) and measure every run against the picker (a full local decision), "+
			"through the follower (the follower parses, the picker decides the ticket), and against the picker again: the picker's CPU per decision either way, and the follower's")
}

// leaderArgs are the spawned picker's extra flags for --compare-tickets:
// a replica identity in dir and the link on a free port.
func (t *ticketFlags) leaderArgs(dir string) ([]string, error) {
	if !t.compare {
		return nil, nil
	}
	t.replicaDir = filepath.Join(dir, "replica")
	if err := os.MkdirAll(t.replicaDir, 0o700); err != nil {
		return nil, err
	}
	ca, err := tlsutil.NewCA("loadgen replicas")
	if err != nil {
		return nil, err
	}
	if err := ca.WriteReplica(t.replicaDir, "loadgen"); err != nil {
		return nil, err
	}
	if t.replicaPort, err = launch.FreePort("127.0.0.1"); err != nil {
		return nil, err
	}
	return []string{"--replica-cert-path=" + t.replicaDir, "--replica-port=" + strconv.Itoa(t.replicaPort)}, nil
}

// ticketsName names the follower's results.
const ticketsName = "tickets"

// spawnFollower starts the follower of the spawned picker, routing to the
// same idle endpoint, and connects to it; the runs through it sample the
// leader's CPU (leaderCPU) as the picker's, and the follower's beside.
func spawnFollower(ctx context.Context, f *flags, leaderCPU load.CPUSampler) (*picker, func(), error) {
	dir, err := os.MkdirTemp("", "loadgen-follower-")
	if err != nil {
		return nil, nil, fmt.Errorf("temp dir: %w", err)
	}
	logf, err := os.Create(filepath.Join(dir, "follower.log"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("follower log: %w", err)
	}
	bins := launch.Binaries{Epp: spawnedBin}
	args := append([]string{"--replica-cert-path=" + tk.replicaDir, "--replica-port=0",
		"--replica-leader=" + launch.HostPort("127.0.0.1", tk.replicaPort)}, f.eppArgs...)
	p, err := bins.StartEPP(ctx, launch.EPPOptions{TLS: f.tls, Endpoints: []string{spawnedEndpoint}, Args: args,
		Proc: launch.ProcOptions{Name: "follower", Output: logf}})
	if err != nil {
		logf.Close()
		return nil, nil, fmt.Errorf("follower: %w (log in %s)", err, logf.Name())
	}
	stop := func() {
		err := p.Stop(30 * time.Second)
		logf.Close()
		if err != nil {
			fmt.Fprintf(os.Stderr, "loadgen: follower: %v (log in %s)\n", err, logf.Name())
			return
		}
		os.RemoveAll(dir)
	}
	fmt.Fprintf(os.Stderr, "loadgen: spawned follower pid %d, ext_proc %s, sending tickets to the picker's replica link at 127.0.0.1:%d\n",
		p.Cmd.Process.Pid, p.GRPCAddr, tk.replicaPort)
	ref, closeConns, err := connect(ctx, f, ticketsName, "tickets (through a follower: it parses, the picker decides)", p.GRPCAddr, leaderCPU)
	if err != nil {
		stop()
		return nil, nil, err
	}
	ref.follower = load.ProcCPU(p.Cmd.Process.Pid)
	ref.routes = func() (map[string]float64, error) { return routeCounts(ctx, p.Metrics) }
	// The warm-up started the link; make sure the runs measure tickets.
	deadline := time.Now().Add(30 * time.Second)
	for {
		before, err1 := ref.routes()
		_, err2 := ref.r.RunClosed(ctx, load.Config{Concurrency: 8, Duration: 200 * time.Millisecond, PromptTokens: f.tokens})
		after, err3 := ref.routes()
		if err1 == nil && err2 == nil && err3 == nil && after["forwarded"] > before["forwarded"] {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			closeConns()
			stop()
			return nil, nil, fmt.Errorf("follower: no ticket reached the picker within 30 s (log in %s)", logf.Name())
		}
	}
	return ref, func() { closeConns(); stop() }, nil
}

// routeCounts reads where a replica's requests were decided
// (laneway_ha_streams_total by route).
func routeCounts(ctx context.Context, page launch.Page) (map[string]float64, error) {
	c, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := page.Scrape(c)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, r := range m.LabelValues("laneway_ha_streams_total", "route") {
		out[r] = m.Value("laneway_ha_streams_total", "route", r)
	}
	return out, nil
}

// followerSide is what a run through the follower measured beside the
// picker's CPU: the follower's own CPU per 1,000 decisions, and how many
// of its decisions were not tickets (decided by the follower itself).
type followerSide struct {
	cpuPer1000 float64
	notTickets float64
}

// runFollower runs cfg through the follower p, sampling its CPU and
// routes around the run.
func runFollower(ctx context.Context, f *flags, p *picker, cfg load.Config) (load.Result, followerSide, error) {
	var side followerSide
	cpu0, err := p.follower()
	if err != nil {
		return load.Result{}, side, err
	}
	r0, err := p.routes()
	if err != nil {
		return load.Result{}, side, err
	}
	res, err := p.run(ctx, f, cfg)
	if err != nil {
		return res, side, err
	}
	cpu1, err := p.follower()
	if err != nil {
		return res, side, err
	}
	r1, err := p.routes()
	if err != nil {
		return res, side, err
	}
	if res.Routed > 0 {
		side.cpuPer1000 = (cpu1 - cpu0) / float64(res.Routed) * 1000
	}
	for route, n := range r1 {
		if route != "forwarded" {
			side.notTickets += n - r0[route]
		}
	}
	return res, side, nil
}
