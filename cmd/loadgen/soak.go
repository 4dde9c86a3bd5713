package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/internal/testbed/load"
	"github.com/laneway-dev/laneway/internal/tlsutil"
)

// soakFlags are the flags of --soak, the long run that looks for leaks
// (`make soak`). They live apart from flags, as the lwepp comparison's
// do.
type soakFlags struct {
	on                 bool
	endpoints, spare   int
	churnEvery         time.Duration
	policyEvery        time.Duration
	sampleEvery        time.Duration
	warm               time.Duration
	settle             time.Duration
	maxGoroutineGrowth int
	maxRSSGrowthMiB    float64
	pollInterval       time.Duration
	sharedTokens       int
	reportFile         string
}

// sk holds the parsed soakFlags.
var sk soakFlags

func (s *soakFlags) register(fs *pflag.FlagSet) {
	fs.BoolVar(&s.on, "soak", false,
		"soak instead of a latency run: build and start the picker with --endpoints-file and --policy-config, run the open loop at --rate for --duration "+
			"(up to 24h) while endpoints churn and the policy changes, and report RSS over time, goroutines before and after, and whether every request was answered exactly once; "+
			"exits 1 when a bound below is broken")
	fs.IntVar(&s.endpoints, "soak-endpoints", 8, "soak: idle stand-in endpoints in the picker's set at any time")
	fs.IntVar(&s.spare, "soak-spare-endpoints", 4, "soak: further stand-ins the churn rotates in and out")
	fs.DurationVar(&s.churnEvery, "soak-churn-every", 2*time.Second, "soak: one endpoint leaves the set and a spare joins it this often (the endpoints file is rewritten)")
	fs.DurationVar(&s.policyEvery, "soak-policy-every", 10*time.Second, "soak: the policy file alternates between two policies this often")
	fs.DurationVar(&s.sampleEvery, "soak-sample-every", 10*time.Second, "soak: how often the picker's RSS, heap and goroutines are sampled")
	fs.DurationVar(&s.warm, "soak-warm", 0,
		"soak: RSS growth is judged from the first sample this far into the load to its end (0: half the run; the prefix index fills for its 10-minute TTL first, which is growth by design)")
	fs.DurationVar(&s.settle, "soak-settle", 90*time.Second,
		"soak: after the load, how long the picker's goroutines may take to come back to their number before it (above the scraper's 1-minute idle-connection timeout: connections to endpoints that left linger that long)")
	fs.IntVar(&s.sharedTokens, "soak-shared-prompt-tokens", 64, "soak: tokens every prompt starts with (a system prompt); the rest of each prompt is its own")
	fs.IntVar(&s.maxGoroutineGrowth, "soak-max-goroutine-growth", 5, "soak: most goroutines the picker may have after the load above its count before it")
	fs.Float64Var(&s.maxRSSGrowthMiB, "soak-max-rss-growth-mib", 32, "soak: most the picker's RSS may grow from the --soak-warm sample to the end of the load, in MiB")
	fs.DurationVar(&s.pollInterval, "soak-poll-interval", 250*time.Millisecond, "soak: the picker's --policy-poll-interval, for the endpoints file and the policy file")
	fs.StringVar(&s.reportFile, "soak-report", "", "soak: also write the report and every sample to this file")
}

// soakPolicies are the two policies the soak alternates: the classes'
// shares swap, the busy threshold tightens below the offered load (so
// requests queue, and some meet a queue limit or max_queue_wait) and a
// third class comes and goes. At 500/s with a 1 s hold about 500
// requests are in flight over 8 endpoints, each charged its 192 uncached
// prompt tokens (256 less the 64 shared ones the prefix index finds):
// about 12,000 tokens per endpoint, between the two thresholds.
var soakPolicies = [2]string{`
default_policy_class: regular
policy_classes:
  - name: premium
    queue_policy: fcfs
    quantum: 512
    prefill_busy_threshold: 20000
    request_queue_limit_per_worker: 256
    max_queue_wait: 5s
  - name: regular
    queue_policy: fcfs
    quantum: 128
    prefill_busy_threshold: 20000
    request_queue_limit_per_worker: 256
    max_queue_wait: 5s
`, `
default_policy_class: regular
policy_classes:
  - name: premium
    queue_policy: wspt
    quantum: 128
    prefill_busy_threshold: 10000
    request_queue_limit_per_worker: 32
    max_queue_wait: 2s
  - name: regular
    queue_policy: fcfs
    quantum: 512
    prefill_busy_threshold: 10000
    request_queue_limit_per_worker: 64
    max_queue_wait: 2s
  - name: batch
    queue_policy: edf
    quantum: 64
    prefill_busy_threshold: 8000
`}

// soakClasses are the classes the soak's two connections send to.
var soakClasses = []string{"premium", "regular"}

// validateSoak checks the flags that --soak combines with.
func validateSoak(f *flags) error {
	var errs []error
	if f.epp != "" {
		errs = append(errs, errors.New("--soak starts its own picker: it rewrites the picker's endpoints and policy files; drop --epp"))
	}
	if f.mode != "open" || lw.compare || f.floor {
		errs = append(errs, errors.New("--soak is an open loop of its own: not with --mode closed, --compare-lwepp or --compare-floor"))
	}
	if sk.endpoints < 1 || sk.spare < 1 {
		errs = append(errs, fmt.Errorf("--soak-endpoints %d and --soak-spare-endpoints %d: want at least 1 each", sk.endpoints, sk.spare))
	}
	for name, d := range map[string]time.Duration{"--soak-churn-every": sk.churnEvery, "--soak-policy-every": sk.policyEvery,
		"--soak-sample-every": sk.sampleEvery, "--soak-poll-interval": sk.pollInterval} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s %s: want > 0", name, d))
		}
	}
	return errors.Join(errs...)
}

// soakWorld is what the soak's actions change: the endpoints file (a ring
// of stand-ins, the first n of which are in the set) and the policy file.
type soakWorld struct {
	endpoints, policy string // the files' paths
	ring              []string
	n                 int
}

// writeAtomic replaces path with data by a rename, as a ConfigMap volume
// update lands: the picker never reads half a file.
func writeAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// active returns the addresses in the set after `churns` churns: n
// consecutive entries of the ring.
func (w *soakWorld) active(churns int) []string {
	out := make([]string, 0, w.n)
	for i := range w.n {
		out = append(out, w.ring[(churns+i)%len(w.ring)])
	}
	return out
}

func (w *soakWorld) writeEndpoints(churns int) error {
	body := fmt.Sprintf("# soak: set after %d churns\n%s\n", churns, strings.Join(w.active(churns), "\n"))
	return writeAtomic(w.endpoints, []byte(body))
}

func (w *soakWorld) writePolicy(changes int) error {
	return writeAtomic(w.policy, []byte(soakPolicies[changes%2]))
}

// runSoak is --soak: the stand-ins, the picker, the soak, the report and
// the verdict.
func runSoak(ctx context.Context, f *flags) error {
	if err := validateSoak(f); err != nil {
		return err
	}
	f.spawn = true // the soak always starts its own picker
	cfg := load.SoakConfig{Rate: f.rate, Hold: f.hold, Duration: f.duration, PromptTokens: f.tokens, HeaderOnly: !f.phases,
		SharedPromptTokens: sk.sharedTokens, SampleEvery: sk.sampleEvery, Settle: sk.settle}
	if err := cfg.Validate(); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "loadgen-soak-")
	if err != nil {
		return fmt.Errorf("temp dir: %w", err)
	}
	keep := true // the picker's log stays when anything went wrong
	defer func() {
		if !keep {
			os.RemoveAll(dir)
		}
	}()
	w := &soakWorld{endpoints: filepath.Join(dir, "endpoints"), policy: filepath.Join(dir, "policy.yaml"), n: sk.endpoints}
	for range sk.endpoints + sk.spare {
		e, err := load.StartIdleEndpoint()
		if err != nil {
			return err
		}
		defer e.Close()
		w.ring = append(w.ring, e.Addr())
	}
	if err := errors.Join(w.writeEndpoints(0), w.writePolicy(0)); err != nil {
		return fmt.Errorf("soak files: %w", err)
	}

	bins := launch.Binaries{Epp: f.eppBin}
	if bins.Epp == "" {
		fmt.Fprintln(os.Stderr, "loadgen: building ./cmd/epp")
		if bins, err = launch.Build(dir, false, launch.CmdEpp); err != nil {
			return err
		}
	}
	logf, err := os.Create(filepath.Join(dir, "epp.log"))
	if err != nil {
		return fmt.Errorf("picker log: %w", err)
	}
	defer logf.Close()
	// pprof on loopback, for the goroutine dumps before and after.
	pprofPort, err := launch.FreePort("127.0.0.1")
	if err != nil {
		return err
	}
	pprof := launch.HostPort("127.0.0.1", pprofPort)
	args := append([]string{"--endpoints-file=" + w.endpoints, "--policy-poll-interval=" + sk.pollInterval.String(),
		"--pprof-port=" + strconv.Itoa(pprofPort)}, f.eppArgs...)
	p, err := bins.StartEPP(ctx, launch.EPPOptions{TLS: f.tls, Policy: w.policy, Args: args, Proc: launch.ProcOptions{Output: logf}})
	if err != nil {
		return fmt.Errorf("%w (picker log in %s)", err, logf.Name())
	}
	stopped := false
	defer func() {
		if !stopped {
			p.Kill()
		}
	}()
	fmt.Fprintf(os.Stderr, "loadgen: soak picker pid %d, ext_proc %s (tls %v), metrics %s, log %s\n",
		p.Cmd.Process.Pid, p.GRPCAddr, f.tls, p.MetricsAddr, logf.Name())

	// The goroutine dumps go next to the report when there is one, else
	// into the kept directory.
	dumpDir := dir
	if sk.reportFile != "" {
		dumpDir = filepath.Dir(sk.reportFile)
		if err := os.MkdirAll(dumpDir, 0o755); err != nil {
			return fmt.Errorf("--soak-report: %w", err)
		}
	}
	k := &load.Soak{
		Addr:   p.GRPCAddr,
		Sample: load.PickerSample(p.MetricsAddr),
		Actions: []load.Action{
			{Name: "endpoint churn", Every: sk.churnEvery, Do: func(_ context.Context, n int) error { return w.writeEndpoints(n + 1) }},
			{Name: "policy change", Every: sk.policyEvery, Do: func(_ context.Context, n int) error { return w.writePolicy(n + 1) }},
		},
		Goroutines: load.ProfileGoroutines(pprof,
			filepath.Join(dumpDir, "goroutines-before.txt"), filepath.Join(dumpDir, "goroutines-after.txt")),
		Progress: func(s load.Sample) {
			fmt.Fprintf(os.Stderr, "loadgen: soak t=%s rss=%.1fMiB heap=%.1fMiB goroutines=%d open=%d queued=%.0f\n",
				s.At.Round(time.Second), s.RSSBytes/(1<<20), s.HeapBytes/(1<<20), s.Goroutines, s.Open, s.Queued)
		},
	}
	for _, c := range soakClasses {
		k.Headers = append(k.Headers, http.Header{"x-laneway-policy-class": {c}})
	}
	if f.tls {
		k.TLS = tlsutil.ClientConfig(true) // the spawned picker's certificate is self-signed
	}
	fmt.Fprintf(os.Stderr, "loadgen: soak %s at %g/s, hold %s, %d endpoints (+%d rotating), churn every %s, policy change every %s\n",
		f.duration, f.rate, f.hold, sk.endpoints, sk.spare, sk.churnEvery, sk.policyEvery)
	res, err := k.Run(ctx, cfg)
	if err != nil {
		return fmt.Errorf("%w (picker log in %s)", err, logf.Name())
	}
	streamsSeen := res.After.Streams - res.Before.Streams

	log := p.Log.String()
	applied := fmt.Sprintf("  picker applied %d endpoint-file versions and %d policies (from its log); counted %.0f streams\n",
		strings.Count(log, "endpoints file reloaded"), strings.Count(log, "policy reloaded"), streamsSeen)
	stopErr := p.Stop(30 * time.Second)
	stopped = true

	warm := sk.warm
	if warm <= 0 {
		warm = f.duration / 2
	}
	report := fmt.Sprintf("[soak tls=%v prompt_tokens=%d epp_gomaxprocs=%s]\n%s%s", f.tls, f.tokens, eppProcsLabel(f), res.String(warm), applied)
	fmt.Print(report)
	if sk.reportFile != "" {
		err := os.MkdirAll(filepath.Dir(sk.reportFile), 0o755)
		if err == nil {
			err = os.WriteFile(sk.reportFile, []byte(report+samplesTable(&res)), 0o644)
		}
		if err != nil {
			return fmt.Errorf("--soak-report: %w", err)
		}
	}
	verdict := soakVerdict(&res, warm, streamsSeen, stopErr)
	if verdict != nil {
		return fmt.Errorf("soak failed (picker log kept in %s, goroutine dumps before and after the load in %s):\n%w", dir, dumpDir, verdict)
	}
	keep = false
	return nil
}

// soakVerdict names every bound the soak broke.
func soakVerdict(res *load.SoakResult, warm time.Duration, streams float64, stopErr error) error {
	var errs []error
	if !res.ExactlyOnce() {
		errs = append(errs, fmt.Errorf("%d of %d requests were not answered exactly once", res.Load.Started-res.AnsweredOnce, res.Load.Started))
	}
	if res.Load.Errors > 0 {
		errs = append(errs, fmt.Errorf("%d transport or protocol errors", res.Load.Errors))
	}
	if streams != float64(res.Load.Started) {
		errs = append(errs, fmt.Errorf("the picker counted %.0f streams for %d requests sent", streams, res.Load.Started))
	}
	if g := res.After.Goroutines - res.Before.Goroutines; g > sk.maxGoroutineGrowth {
		errs = append(errs, fmt.Errorf("the picker has %d goroutines more after the load than before (bound %d)", g, sk.maxGoroutineGrowth))
	}
	if g := (res.End().RSSBytes - res.Warm(warm).RSSBytes) / (1 << 20); g > sk.maxRSSGrowthMiB {
		errs = append(errs, fmt.Errorf("the picker's RSS grew %.1f MiB from %s to the end of the load (bound %.0f MiB)", g, res.Warm(warm).At.Round(time.Second), sk.maxRSSGrowthMiB))
	}
	for name, a := range res.Actions {
		if a.Errors > 0 {
			errs = append(errs, fmt.Errorf("action %s failed %d times: %s", name, a.Errors, a.FirstError))
		}
	}
	if stopErr != nil {
		errs = append(errs, fmt.Errorf("picker stop: %w", stopErr))
	}
	return errors.Join(errs...)
}

// samplesTable is every sample as a table, for the report file.
func samplesTable(res *load.SoakResult) string {
	var b strings.Builder
	b.WriteString("\nsamples: t_s rss_mib heap_mib goroutines open queued\n")
	row := func(label string, s load.Sample) {
		fmt.Fprintf(&b, "%s %.0f %.1f %.1f %d %d %.0f\n", label, s.At.Seconds(), s.RSSBytes/(1<<20), s.HeapBytes/(1<<20), s.Goroutines, s.Open, s.Queued)
	}
	row("before", res.Before)
	for _, s := range res.Samples {
		row("load", s)
	}
	row("after", res.After)
	return b.String()
}
