package simulate

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"

	"github.com/laneway-dev/laneway/internal/testbed/report"
	"github.com/laneway-dev/laneway/pkg/engine"
)

// Config is one `laneway simulate` invocation.
type Config struct {
	// Policies are the --policy arguments: files, none, round-robin.
	Policies []string
	// Trace is a trace file; Generate a --generate SPEC (one of them).
	Trace    string
	Generate string
	// TraceOptions read and shape the trace (format, time scale, limits).
	TraceOptions
	// AssignClass and AssignTenant are rules (ParseRule) for requests
	// without a class header or tenant.
	AssignClass, AssignTenant string
	// Servers identical servers with Engine, unless Fleet names a fleet
	// file.
	Servers int
	Fleet   string
	Engine  engine.Config
	// Picker is the policy files' picker.
	Picker string
	Seed   uint64
	// Out is the output folder.
	Out string
	// ScrapeInterval, Retries, RetryDelay, PrefixCacheTTL: see Options.
	ScrapeInterval time.Duration
	Retries        int
	RetryDelay     time.Duration
	PrefixCacheTTL time.Duration
	// NoPlots skips the figures.
	NoPlots bool
	// DisaggregateAboveUncachedTokens, LoRAAffinity: the picker's flags of
	// those names (see Options). KVTransferTime is the decode servers'
	// default in a fleet file.
	DisaggregateAboveUncachedTokens uint64
	LoRAAffinity                    bool
	KVTransferTime                  time.Duration
}

// DefaultConfig returns the defaults of the flags.
func DefaultConfig() Config {
	return Config{
		Servers:        1,
		Engine:         engine.DefaultConfig(),
		Picker:         PickerPrefix,
		Seed:           1,
		Out:            "simulate-out",
		RetryDelay:     time.Second,
		PrefixCacheTTL: DefaultPrefixCacheTTL,

		DisaggregateAboveUncachedTokens: DefaultDisaggregateAboveUncachedTokens,
		LoRAAffinity:                    true,
	}
}

// DefaultDisaggregateAboveUncachedTokens is the picker's
// --disaggregate-above-uncached-tokens default.
const DefaultDisaggregateAboveUncachedTokens = 256

// AddFlags binds c to fs. The engine flags have cmd/modelsim's names and
// defaults; the picker sees each server's --max-num-batched-tokens.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringArrayVar(&c.Policies, "policy", c.Policies, "policy to simulate, repeatable: a policy YAML file or PolicyProfile/PolicyClass manifests (named by the file name without extension), or the baselines none (no queueing, least-loaded pick) and round-robin (no queueing, endpoints in turn); default none")
	fs.StringVar(&c.Trace, "trace", c.Trace, "trace file: Laneway JSONL (.jsonl), a Mooncake trace (JSONL with hash_ids) or an Azure LLM inference trace (.csv: TIMESTAMP,ContextTokens,GeneratedTokens); several as FILE,FILE merge, CLASS=FILE gives a file's requests a class header")
	fs.StringVar(&c.Generate, "generate", c.Generate, "generate a synthetic trace instead of --trace (see SPEC below)")
	c.addTraceFlags(fs)
	fs.StringVar(&c.AssignClass, "assign-class", c.AssignClass, "class header for requests without one: length:NAME<N,...,NAME | split:NAME=W,... | uniform:N[/PREFIX]")
	fs.StringVar(&c.AssignTenant, "assign-tenant", c.AssignTenant, "tenant for requests without one (same forms as --assign-class)")
	fs.IntVar(&c.Servers, "servers", c.Servers, "number of identical model servers (the engine flags below)")
	fs.StringVar(&c.Fleet, "fleet", c.Fleet, "fleet file of mixed servers (YAML: servers: [{count, max_num_seqs, ...}]) instead of --servers")
	c.Engine.AddFlags(fs)
	fs.StringVar(&c.Picker, "picker", c.Picker, "endpoint choice of the policy files' runs: prefix (prefix-cache overlap plus load, the picker's default) or least-loaded")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of --generate, of the assignment rules, of --jitter and of the picker's tie-breaks")
	fs.StringVar(&c.Out, "out", c.Out, "output folder: DIR/<policy>/requests.jsonl, DIR/summary.json, DIR/*.png and *.svg")
	fs.DurationVar(&c.ScrapeInterval, "scrape-interval", c.ScrapeInterval, "feed each server's engine metrics to the picker this often, as its scraper would (0: no scraping, except a policy with an auto threshold, scraped every 100ms as the picker does)")
	fs.IntVar(&c.Retries, "retry-429", c.Retries, "offer a request answered 429 again, up to this many times (0: a 429 is final)")
	fs.DurationVar(&c.RetryDelay, "retry-delay", c.RetryDelay, "wait before offering a 429'd request again")
	fs.DurationVar(&c.PrefixCacheTTL, "prefix-cache-ttl", c.PrefixCacheTTL, "the picker's prefix index ages entries this long after their last use (0: by capacity only)")
	fs.BoolVar(&c.NoPlots, "no-plots", c.NoPlots, "skip the PNG and SVG figures")
	fs.IntVar(&c.Engine.MaxLoRAs, "max-loras", c.Engine.MaxLoRAs, "LoRA adapters resident at once in each server (0: no bound, and no adapter metrics for the picker)")
	fs.DurationVar(&c.KVTransferTime, "kv-transfer-time", c.KVTransferTime, "a fleet file's decode servers' wait for a disaggregated request's KV cache, unless a group sets kv_transfer_time")
	fs.Uint64Var(&c.DisaggregateAboveUncachedTokens, "disaggregate-above-uncached-tokens", c.DisaggregateAboveUncachedTokens, "in a fleet with prefill servers (role: prefill), disaggregate requests whose uncached prompt tokens are above this (the picker's flag)")
	fs.BoolVar(&c.LoRAAffinity, "lora-affinity", c.LoRAAffinity, "rank servers where a request's LoRA adapter runs first (the picker's flag; needs --scrape-interval for the adapter metrics)")
}

// Setup is an invocation's inputs, read and checked.
type Setup struct {
	Trace    *Trace
	Fleet    *Fleet
	Policies []*Policy
}

// Load reads the trace, the fleet and the policies of c.
func (c *Config) Load() (*Setup, error) {
	var s Setup
	var err error
	if s.Trace, err = c.readTrace(); err != nil {
		return nil, err
	}
	var classRule, tenantRule *Rule
	if c.AssignClass != "" {
		if classRule, err = ParseRule(c.AssignClass); err != nil {
			return nil, fmt.Errorf("--assign-class: %w", err)
		}
	}
	if c.AssignTenant != "" {
		if tenantRule, err = ParseRule(c.AssignTenant); err != nil {
			return nil, fmt.Errorf("--assign-tenant: %w", err)
		}
	}
	s.Trace.Assign(classRule, tenantRule, c.Seed)
	if s.Trace, err = c.Shape(s.Trace, c.Seed); err != nil {
		return nil, err
	}
	if c.Fleet != "" {
		s.Fleet, err = LoadFleetWith(c.Fleet, Server{Engine: c.Engine, KVTransferTime: c.KVTransferTime})
	} else {
		s.Fleet, err = NewFleet(c.Servers, c.Engine)
	}
	if err != nil {
		return nil, err
	}
	if s.Policies, err = LoadPolicies(c.Policies, c.Picker, s.Trace); err != nil {
		return nil, err
	}
	return &s, nil
}

// Options are the run options of c.
func (c *Config) Options() Options {
	return Options{Seed: c.Seed, ScrapeInterval: c.ScrapeInterval, Retries: c.Retries, RetryDelay: c.RetryDelay,
		PrefixCacheTTL: c.PrefixCacheTTL, DisaggregateAboveUncachedTokens: c.DisaggregateAboveUncachedTokens,
		NoLoRAAffinity: !c.LoRAAffinity}
}

// RunAll simulates every policy of s and summarizes them; progressTo, when
// not nil, receives each run's progress (report.Progress: a bar on a
// terminal, a line at every 10% elsewhere, nothing for a run shorter than
// a second).
func RunAll(s *Setup, opts Options, progressTo io.Writer) ([]*Result, *Summary, error) {
	sum := &Summary{
		Trace: TraceInfo{Source: s.Trace.Source, Requests: len(s.Trace.Requests), SpanS: s.Trace.Span().Seconds(), Tenants: s.Trace.Tenants()},
		Fleet: fleetInfo(s.Fleet),
		Seed:  opts.Seed,
	}
	var results []*Result
	for _, p := range s.Policies {
		bar := report.NewProgress(progressTo, p.Name)
		o := opts
		o.Progress = bar.Update
		res, err := Run(s.Trace, s.Fleet, p, o)
		bar.Finish()
		if err != nil {
			return nil, nil, err
		}
		results = append(results, res)
		sum.Policies = append(sum.Policies, Summarize(s.Trace, res))
	}
	return results, sum, nil
}

// Main runs an invocation: it simulates, writes DIR's files and prints the
// table on stdout and the files written and the progress bar on stderr.
func Main(c *Config, stdout, stderr io.Writer) error {
	s, err := c.Load()
	if err != nil {
		return err
	}
	results, sum, err := RunAll(s, c.Options(), stderr)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.Out, 0o755); err != nil {
		return fmt.Errorf("output: %w", err)
	}
	if err := WriteOutputs(c.Out, s.Trace, results, sum); err != nil {
		return err
	}
	if err := WriteTable(stdout, sum); err != nil {
		return err
	}
	files := []string{filepath.Join(c.Out, "summary.json")}
	for _, r := range results {
		files = append(files, filepath.Join(c.Out, r.Policy.Name, "requests.jsonl"))
	}
	if !c.NoPlots {
		plots, err := WritePlots(c.Out, s.Trace, results)
		if err != nil {
			return err
		}
		files = append(files, plots...)
	}
	for _, f := range files {
		fmt.Fprintln(stderr, "wrote", f)
	}
	return nil
}
