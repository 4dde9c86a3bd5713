// Command loadgen drives ext_proc load against an endpoint picker and
// reports decision latency, decisions per second, errors and the picker's
// CPU per 1,000 decisions, the way SPEC §13 measures them. The open loop
// plays the gateway with internal/testbed/load/h2client, an event-driven HTTP/2 client
// as cheap per stream as Envoy is (--client grpc uses the goroutine-per-
// stream internal/testbed/extprocclient instead); the closed loop always uses
// internal/testbed/extprocclient. See package internal/testbed/load for the modes:
//
//	loadgen --spawn --rate 1000 --hold 1s --duration 10s          # open loop (SPEC §13)
//	loadgen --spawn --mode closed --concurrency 1,100,1000        # closed loop, N streams
//	loadgen --epp 127.0.0.1:9002 --tls --epp-metrics 127.0.0.1:9090 --rate 3000
//	loadgen --soak --tls --rate 500 --duration 30m                # soak (make soak)
//	loadgen --spawn --response-phases=false --rate 1000           # a gateway that sends no response phase
//	loadgen --trace mooncake.jsonl --duration 3m --servers 2 --spawn # a trace through real processes
//
// With --spawn it builds (or takes --epp-bin) and starts the picker itself
// on free loopback ports, with no policy and one dummy endpoint that serves
// an idle vLLM /metrics page: the synthetic default class has no busy
// threshold and the endpoint is idle, so every request is an idle-endpoint
// decision.
//
// With --trace it replays a recorded trace through real processes instead
// (replay.go): the local gateway, the picker and modelsim servers, open
// loop, with `laneway simulate`'s trace, fleet and policy flags, writing
// the simulator's outputs, so the two compare line for line.
//
// With --soak it runs the long leak hunt of `make soak` instead (soak.go):
// the picker with an endpoints file and a policy file that keep changing,
// the open loop for up to a day, RSS and goroutines sampled throughout,
// and every request's answers counted.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/internal/testbed/load"
)

type flags struct {
	epp         string
	tls         bool
	conns       int
	mode        string
	rate        float64
	hold        time.Duration
	duration    time.Duration
	concurrency string
	capN        int
	tokens      int
	spawn       bool
	eppBin      string
	eppArgs     []string
	eppMetrics  string
	eppPID      int
	warmup      time.Duration
	jsonOut     bool
	latencyLog  string
	client      string
	cpuProfile  string
	procs       int
	eppProcs    int
	floor       bool
	phases      bool
}

func main() {
	maybeServeFloor()
	maybeReplay()
	var f flags
	fs := pflag.NewFlagSet("loadgen", pflag.ExitOnError)
	fs.StringVar(&f.epp, "epp", "", "ext_proc address of the picker (host:port); not with --spawn")
	fs.BoolVar(&f.tls, "tls", false, "speak TLS to the picker (certificate not verified, ALPN h2); with --spawn, start it with --secure-serving")
	fs.IntVar(&f.conns, "conns", 2, "gRPC connections to spread streams over (a gateway holds about one per worker)")
	fs.StringVar(&f.mode, "mode", "open", "open: fixed arrival rate (SPEC §13 latency); closed: fixed concurrency (throughput)")
	fs.Float64Var(&f.rate, "rate", 1000, "open loop: arrivals per second")
	fs.DurationVar(&f.hold, "hold", time.Second, "how long each routed request stays open before its response (closed loop: default 0)")
	fs.DurationVar(&f.duration, "duration", 10*time.Second, "length of each run")
	fs.StringVar(&f.concurrency, "concurrency", "1,100,1000", "closed loop: comma-separated stream counts, one run each")
	fs.IntVar(&f.capN, "concurrency-cap", 20000, "open loop: most streams open at once; arrivals above it are skipped and counted")
	fs.IntVar(&f.tokens, "prompt-tokens", 256, "prompt length of every request (token ids)")
	fs.BoolVar(&f.spawn, "spawn", false, "build and start the picker against a dummy endpoint")
	fs.StringVar(&f.eppBin, "epp-bin", "", "with --spawn: the epp binary (default: build ./cmd/epp of this module)")
	fs.StringSliceVar(&f.eppArgs, "epp-args", nil, "with --spawn: further picker flags, e.g. --epp-args=--pprof-port=6060")
	fs.StringVar(&f.eppMetrics, "epp-metrics", "", "picker metrics address (host:port) to read process_cpu_seconds_total from")
	fs.IntVar(&f.eppPID, "epp-pid", 0, "picker process id to read CPU time from /proc")
	fs.DurationVar(&f.warmup, "warmup", time.Second, "closed-loop warm-up (8 streams) before measuring; 0 skips")
	fs.BoolVar(&f.jsonOut, "json", false, "print each result as one JSON line")
	fs.StringVar(&f.latencyLog, "latency-log", "", "write every request's start time and decision latency to this file")
	lw.register(fs)
	sk.register(fs)
	tk.register(fs)
	fs.BoolVar(&f.floor, "compare-floor", false,
		"with --spawn: also start a grpc-go ext_proc server that only answers (same transport options, same endpoint; this machine's transport floor) "+
			"and measure laneway, floor, laneway again for every run: Laneway's latency above the floor is what its own work adds")
	fs.IntVar(&f.procs, "procs", 1, "GOMAXPROCS of the load tool itself; 1 keeps its Go scheduler from spinning on the cores the picker needs (0: Go's default)")
	fs.IntVar(&f.eppProcs, "epp-gomaxprocs", 0, "with --spawn: GOMAXPROCS of the spawned picker(s), as a container CPU limit would set it (0: the picker's default, one per core)")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "write the load tool's own CPU profile to this file (to keep the tool out of the tail it measures)")
	fs.BoolVar(&f.phases, "response-phases", true,
		"play the response phases after the hold; false plays a gateway that sends none (Envoy with the response phases skipped): "+
			"each stream half-closes after the request and ends with the picker's answer, so --hold does not apply")
	fs.StringVar(&f.client, "client", "h2", "open loop: h2 (event-driven HTTP/2 gateway, few goroutines, as Envoy is) or grpc (a grpc-go stream and goroutine per request)")
	_ = fs.Parse(os.Args[1:])
	if !fs.Changed("hold") && f.mode == "closed" {
		f.hold = 0
	}
	if f.procs > 0 {
		runtime.GOMAXPROCS(f.procs)
	}
	if f.eppProcs > 0 {
		// Spawned pickers (Laneway's and lwepp) inherit the environment.
		_ = os.Setenv("GOMAXPROCS", strconv.Itoa(f.eppProcs))
	} else {
		_ = os.Unsetenv("GOMAXPROCS")
	}
	if f.cpuProfile != "" {
		pf, err := os.Create(f.cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(pf)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "loadgen: --cpuprofile:", err)
			os.Exit(2)
		}
		defer pf.Close()
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, &f); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, f *flags) error {
	if sk.on {
		return runSoak(ctx, f)
	}
	levels, err := parseLevels(f.concurrency)
	if err != nil {
		return err
	}
	if f.mode != "open" && f.mode != "closed" {
		return fmt.Errorf("--mode %q: want open or closed", f.mode)
	}
	if f.client != "h2" && f.client != "grpc" {
		return fmt.Errorf("--client %q: want h2 or grpc", f.client)
	}
	if f.conns < 1 || f.conns > 64 {
		return fmt.Errorf("--conns %d: want 1..64", f.conns)
	}
	r := &load.Runner{}
	addr := f.epp
	switch {
	case f.spawn:
		if addr != "" {
			return errors.New("--epp and --spawn exclude each other")
		}
		p, cleanup, err := spawn(ctx, f)
		if err != nil {
			return err
		}
		defer cleanup()
		addr = p.GRPCAddr
		r.PickerCPU = load.ProcCPU(p.Cmd.Process.Pid)
		fmt.Fprintf(os.Stderr, "loadgen: spawned picker pid %d, ext_proc %s (tls %v), metrics %s\n",
			p.Cmd.Process.Pid, p.GRPCAddr, f.tls, p.MetricsAddr)
	case addr == "":
		return errors.New("give --epp host:port or --spawn")
	case f.eppPID > 0:
		r.PickerCPU = load.ProcCPU(f.eppPID)
	case f.eppMetrics != "":
		r.PickerCPU = load.MetricsCPU(f.eppMetrics)
	}
	if r.PickerCPU != nil {
		if _, err := r.PickerCPU(); err != nil {
			return fmt.Errorf("picker CPU sampler: %w", err)
		}
	}

	lane, closeConns, err := connect(ctx, f, "laneway", "", addr, r.PickerCPU)
	if err != nil {
		return err
	}
	defer closeConns()

	if f.latencyLog != "" {
		tf, err := os.Create(f.latencyLog)
		if err != nil {
			return fmt.Errorf("--latency-log: %w", err)
		}
		defer tf.Close()
		lane.r.Trace = tf
	}

	cfg := load.Config{Rate: f.rate, Hold: f.hold, Duration: f.duration, ConcurrencyCap: f.capN, PromptTokens: f.tokens,
		HeaderOnly: !f.phases}
	if lw.compare || f.floor || tk.compare {
		return compare(ctx, f, lane, cfg, levels)
	}
	for _, c := range runConfigs(f, cfg, levels) {
		res, err := lane.run(ctx, f, c)
		if err != nil {
			return err
		}
		if err := report(f, lane, &res); err != nil {
			return err
		}
	}
	return nil
}

// picker is one picker under test: the gRPC runner (warm-up, closed loop,
// --client grpc) and the ext_proc address for the open loop's event-driven
// HTTP/2 client (--client h2). label is printed with each result when not
// empty.
type picker struct {
	name, label string
	r           *load.Runner
	addr        string
	// follower and routes, for the tickets side of --compare-tickets,
	// sample the follower's CPU and its decisions by route.
	follower load.CPUSampler
	routes   func() (map[string]float64, error)
}

// connect dials f.conns gateway clients to addr and warms the picker up
// with a short closed loop. The returned func closes the connections.
func connect(ctx context.Context, f *flags, name, label, addr string, cpu load.CPUSampler) (*picker, func(), error) {
	r := &load.Runner{PickerCPU: cpu}
	creds := insecure.NewCredentials()
	if f.tls {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // pickers serve self-signed certificates
	}
	var conns []*grpc.ClientConn
	closeAll := func() {
		for _, c := range conns {
			c.Close()
		}
	}
	for i := 0; i < f.conns; i++ {
		// Large static windows, as Envoy grants by default (256 MiB), and no
		// BDP pings the gateway would not send either.
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds),
			grpc.WithInitialWindowSize(1<<24), grpc.WithInitialConnWindowSize(1<<28))
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("dial %s %s: %w", name, addr, err)
		}
		conns = append(conns, conn)
		r.Clients = append(r.Clients, extprocclient.New(conn, extprocclient.Options{Shape: f.shape()}))
	}
	if f.warmup > 0 {
		res, err := r.RunClosed(ctx, load.Config{Concurrency: 8, Duration: f.warmup, PromptTokens: f.tokens, HeaderOnly: !f.phases})
		if err == nil && res.Routed == 0 {
			err = fmt.Errorf("routed nothing: %s", res.String())
		}
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("%s warm-up: %w", name, err)
		}
	}
	return &picker{name: name, label: label, r: r, addr: addr}, closeAll, nil
}

// shape is the gateway the gRPC clients play: Envoy with every phase, or
// with the response phases skipped (--response-phases=false).
func (f *flags) shape() extprocclient.Shape {
	if f.phases {
		return extprocclient.Envoy
	}
	return extprocclient.EnvoySkip
}

// runConfigs is the mode's runs: one open loop, or one closed loop per
// concurrency level.
func runConfigs(f *flags, cfg load.Config, levels []int) []load.Config {
	if f.mode == "open" {
		return []load.Config{cfg}
	}
	cfgs := make([]load.Config, 0, len(levels))
	for _, n := range levels {
		c := cfg
		c.Concurrency = n
		cfgs = append(cfgs, c)
	}
	return cfgs
}

// run measures one run of cfg against p with the client the flags choose.
func (p *picker) run(ctx context.Context, f *flags, cfg load.Config) (load.Result, error) {
	switch {
	case f.mode == "closed":
		return p.r.RunClosed(ctx, cfg)
	case f.client == "h2":
		h2 := &load.H2Runner{Addr: p.addr, Conns: f.conns, PickerCPU: p.r.PickerCPU, Trace: p.r.Trace}
		if f.tls {
			h2.TLS = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // pickers serve self-signed certificates
		}
		return h2.RunOpen(ctx, cfg)
	default:
		return p.r.RunOpen(ctx, cfg)
	}
}

// report prints one result: a header line with the run's settings (and
// the picker's label, when comparing) and the result, or one JSON line.
func report(f *flags, p *picker, res *load.Result) error {
	if f.jsonOut {
		var v any = res
		if p.label != "" {
			v = struct {
				Picker string
				Label  string
				Result *load.Result
			}{p.name, p.label, res}
		}
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("encode result: %w", err)
		}
		fmt.Println(string(b))
		return nil
	}
	client := f.client
	if f.mode == "closed" {
		client = "grpc"
	}
	picker := ""
	if p.label != "" {
		picker = "picker=" + p.label + " "
	}
	fmt.Printf("[%sclient=%s tls=%v conns=%d prompt_tokens=%d response_phases=%v load_gomaxprocs=%d epp_gomaxprocs=%s]\n%s\n",
		picker, client, f.tls, f.conns, f.tokens, f.phases, runtime.GOMAXPROCS(0), eppProcsLabel(f), res.String())
	return nil
}

// eppProcsLabel says what GOMAXPROCS the picker runs with, for the report.
func eppProcsLabel(f *flags) string {
	switch {
	case f.eppProcs > 0:
		return strconv.Itoa(f.eppProcs)
	case f.spawn:
		return "default(" + strconv.Itoa(runtime.NumCPU()) + ")"
	default:
		return "unknown"
	}
}

func parseLevels(s string) ([]int, error) {
	var out []int
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		n, err := strconv.Atoi(part)
		if err != nil || n < 1 || n > load.MaxConcurrency {
			return nil, fmt.Errorf("--concurrency: %q is not a stream count in 1..%d", part, load.MaxConcurrency)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("--concurrency: no stream counts")
	}
	return out, nil
}

// spawn builds (unless --epp-bin) and starts the picker with one dummy
// endpoint and no policy, logging to a file in a temp dir that is removed
// at cleanup unless the picker failed.
func spawn(ctx context.Context, f *flags) (*launch.EPP, func(), error) {
	dir, err := os.MkdirTemp("", "loadgen-")
	if err != nil {
		return nil, nil, fmt.Errorf("temp dir: %w", err)
	}
	bins := launch.Binaries{Epp: f.eppBin}
	if bins.Epp == "" {
		fmt.Fprintln(os.Stderr, "loadgen: building ./cmd/epp")
		if bins, err = launch.Build(dir, false, launch.CmdEpp); err != nil {
			os.RemoveAll(dir)
			return nil, nil, err
		}
	}
	spawnedBin = bins.Epp
	replicaArgs, err := tk.leaderArgs(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("replica identity: %w", err)
	}
	logf, err := os.Create(dir + "/epp.log")
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("picker log: %w", err)
	}
	// The dummy endpoint serves only an idle vLLM /metrics page, so the
	// picker's scraper sees a fresh, idle engine; requests are never sent
	// to it (the load tool plays the upstream itself).
	dummy, err := load.StartIdleEndpoint()
	if err != nil {
		logf.Close()
		os.RemoveAll(dir)
		return nil, nil, err
	}
	spawnedEndpoint = dummy.Addr()
	p, err := bins.StartEPP(ctx, launch.EPPOptions{
		TLS: f.tls, Endpoints: []string{dummy.Addr()}, Args: append(replicaArgs, f.eppArgs...), Proc: launch.ProcOptions{Output: logf},
	})
	if err != nil {
		dummy.Close()
		logf.Close()
		return nil, nil, fmt.Errorf("%w (picker log in %s)", err, logf.Name())
	}
	return p, func() {
		err := p.Stop(30 * time.Second)
		dummy.Close()
		logf.Close()
		if err != nil {
			fmt.Fprintf(os.Stderr, "loadgen: %v (picker log in %s)\n", err, logf.Name())
			return
		}
		os.RemoveAll(dir)
	}, nil
}
