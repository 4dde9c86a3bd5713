package epp

import (
	"cmp"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/laneway-dev/laneway/internal/dispatcher"
	"github.com/laneway-dev/laneway/internal/metrics"
	"github.com/laneway-dev/laneway/pkg/affinity"
	"github.com/laneway-dev/laneway/pkg/extproc"
	"github.com/laneway-dev/laneway/pkg/podmetrics"
	"github.com/laneway-dev/laneway/pkg/policy"
	"github.com/laneway-dev/laneway/pkg/sched"
	"github.com/laneway-dev/laneway/pkg/tokenize"
)

// Picker names of --affinity.
const (
	PickerPrefix      = "prefix"
	PickerLeastLoaded = "least-loaded"
)

// IntelOptions are the endpoint-intelligence settings: model-server
// metrics scraping, the prefix-cache index, the picker's cost function and
// priority forwarding.
type IntelOptions struct {
	// ScrapeMetrics scrapes every endpoint's /metrics. Endpoints then count
	// as busy (and are picked last) until their first good scrape and
	// whenever their metrics go stale; turn it off for backends that are
	// not model servers.
	ScrapeMetrics bool
	// ScrapeInterval, MetricsStaleness and ScrapeTimeout: see
	// podmetrics.ScrapeOptions (zero staleness is two intervals, zero
	// timeout is the staleness).
	ScrapeInterval   time.Duration
	MetricsStaleness time.Duration
	ScrapeTimeout    time.Duration
	// Picker is PickerPrefix (prefix overlap and load) or
	// PickerLeastLoaded (the baseline: least active prefill).
	Picker string
	// PrefixBlockSize is the hashing block size in tokens until an engine
	// reports a larger KV block size.
	PrefixBlockSize int
	// PrefixCacheTokens is an endpoint's cache size for the index until
	// its engine reports num_gpu_blocks × block_size.
	PrefixCacheTokens uint64
	// PrefixCacheTTL ages index entries out this long after their last
	// use (0: by capacity only).
	PrefixCacheTTL time.Duration
	// ForwardPriority makes the body's top-level priority the soft
	// priority hint in the engine's polarity, and removes it when there is
	// no hint or the engine takes none (SPEC §6).
	ForwardPriority bool
	// MaxEngineQueue is the overload filter's bound on an engine's
	// waiting requests (0: off).
	MaxEngineQueue int
	// LoRAAffinity ranks endpoints where a request's LoRA adapter runs
	// (then those with room for it) first among equally busy ones.
	LoRAAffinity bool
}

// defaultIntelOptions returns the defaults.
func defaultIntelOptions() IntelOptions {
	return IntelOptions{
		ScrapeMetrics:     true,
		ScrapeInterval:    podmetrics.DefaultScrapeInterval,
		Picker:            PickerPrefix,
		PrefixBlockSize:   sched.DefaultBlockSize,
		PrefixCacheTokens: affinity.DefaultCapacityTokens,
		PrefixCacheTTL:    10 * time.Minute,
		LoRAAffinity:      true,
	}
}

// AddFlags binds the options to fs.
func (o *IntelOptions) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.ScrapeMetrics, "scrape-metrics", o.ScrapeMetrics, "Scrape every endpoint's /metrics (vLLM, SGLang or TRT-LLM names, per --engine-type or the pod's engine-type label). An endpoint is busy and picked last until its first good scrape and while its metrics are stale; turn off for backends that are not model servers.")
	fs.DurationVar(&o.ScrapeInterval, "scrape-interval", o.ScrapeInterval, "Time between two scrapes of one endpoint.")
	fs.DurationVar(&o.MetricsStaleness, "metrics-staleness", o.MetricsStaleness, "Age of an endpoint's last good scrape (from its start) past which the endpoint counts as busy and is picked last (0: two scrape intervals).")
	fs.DurationVar(&o.ScrapeTimeout, "scrape-timeout", o.ScrapeTimeout, "Bound on one scrape (0: the staleness bound).")
	fs.StringVar(&o.Picker, "picker", o.Picker, "Endpoint choice: prefix (prefix-cache overlap plus load) or least-loaded (least active prefill tokens).")
	fs.IntVar(&o.PrefixBlockSize, "prefix-block-size", o.PrefixBlockSize, "Tokens per prefix-cache block for the prefix index, until an engine reports a larger KV block size.")
	fs.Uint64Var(&o.PrefixCacheTokens, "prefix-cache-tokens", o.PrefixCacheTokens, "Prompt tokens the prefix index remembers per endpoint until its engine reports its cache size (num_gpu_blocks × block_size).")
	fs.DurationVar(&o.PrefixCacheTTL, "prefix-cache-ttl", o.PrefixCacheTTL, "How long the prefix index remembers a prompt after its last use (0: forever, bounded by cache size).")
	fs.IntVar(&o.MaxEngineQueue, "max-engine-queue", o.MaxEngineQueue, "Overload filter (SPEC §5): skip an endpoint whose engine reports more waiting requests than this; when that leaves a request no endpoint it gets 503 naming the filter. 0 turns it off.")
	fs.BoolVar(&o.LoRAAffinity, "lora-affinity", o.LoRAAffinity, "For a request whose model is a LoRA adapter (as vllm:lora_requests_info reports them), prefer endpoints where the adapter runs, then those with room under max_lora, before load (SPEC §5).")
	fs.BoolVar(&o.ForwardPriority, "forward-priority", o.ForwardPriority, "Set the body's top-level priority to the request's priority hint in the engine's polarity (vLLM: negated; SGLang: as is; TRT-LLM: not sent). vLLM refuses a non-zero priority unless started with --scheduling-policy priority.")
}

// scrapeOptions is the podmetrics view of the options.
func (o *IntelOptions) scrapeOptions(log logr.Logger) podmetrics.ScrapeOptions {
	return podmetrics.ScrapeOptions{
		Interval:  o.ScrapeInterval,
		Staleness: o.MetricsStaleness,
		Timeout:   o.ScrapeTimeout,
		Log:       log,
	}
}

// validate checks the options.
func (o *IntelOptions) validate() []error {
	var errs []error
	if o.MaxEngineQueue < 0 {
		errs = append(errs, fmt.Errorf("--max-engine-queue: %d is negative", o.MaxEngineQueue))
	}
	if o.ScrapeInterval <= 0 {
		errs = append(errs, fmt.Errorf("--scrape-interval: %s must be positive", o.ScrapeInterval))
	}
	if o.MetricsStaleness < 0 || o.ScrapeTimeout < 0 {
		errs = append(errs, fmt.Errorf("--metrics-staleness (%s) and --scrape-timeout (%s) must not be negative", o.MetricsStaleness, o.ScrapeTimeout))
	}
	if o.ScrapeInterval > 0 {
		if err := o.scrapeOptions(logr.Discard()).Validate(); err != nil {
			errs = append(errs, fmt.Errorf("--metrics-staleness: %w", err))
		}
	}
	if o.Picker != PickerPrefix && o.Picker != PickerLeastLoaded {
		errs = append(errs, fmt.Errorf("--picker: %q is not %s or %s", o.Picker, PickerPrefix, PickerLeastLoaded))
	}
	if o.PrefixBlockSize < 1 {
		errs = append(errs, fmt.Errorf("--prefix-block-size: %d must be at least 1", o.PrefixBlockSize))
	}
	if o.PrefixCacheTTL < 0 {
		errs = append(errs, fmt.Errorf("--prefix-cache-ttl: %s is negative", o.PrefixCacheTTL))
	}
	return errs
}

// intel wires the endpoint intelligence into a server: the dispatcher's
// picker, prefix index and metrics expectations, the scraper that feeds
// it, and the handler hooks (prefix hashing, routed-request metrics and
// priority forwarding).
type intel struct {
	opts   IntelOptions
	engine policy.Engine
	log    logr.Logger

	disp    *dispatcher.Dispatcher
	scraper *podmetrics.Scraper // nil when not scraping

	promptTokens, cachedTokens *prometheus.CounterVec
	// pd counts disaggregation decisions, lora the LoRA tier of adapter
	// picks (children made at attach: the label values are fixed).
	pd   [sched.NumPDDecisions]prometheus.Counter
	lora [sched.NumLoRAOutcomes]prometheus.Counter
	// routedTo caches both counters' children per endpoint.
	routedTo *metrics.Children[routedCounters]
	// live is the endpoint set in force (nil before the first): Routed
	// makes series only for its endpoints (routedTo.GetIf, against the
	// Retain of setEndpoints), so that a request granted just before its
	// endpoint left does not bring the removed series back.
	live atomic.Pointer[map[string]struct{}]
}

// routedCounters are one endpoint's children of the routed-token series.
type routedCounters struct{ prompt, cached prometheus.Counter }

var _ RequestHooks = (*intel)(nil)

func newIntel(opts *Options, log logr.Logger) *intel {
	return &intel{opts: opts.Intel, engine: opts.Engine, log: log}
}

// configure sets the dispatcher options the intelligence needs.
func (in *intel) configure(o *dispatcher.Options) {
	o.DefaultEngine = in.engine
	o.ExpectMetrics = in.opts.ScrapeMetrics
	o.MaxEngineQueue = in.opts.MaxEngineQueue
	o.DisableLoRAAffinity = !in.opts.LoRAAffinity
	o.Prefix = &sched.PrefixOptions{
		BlockSize: in.opts.PrefixBlockSize,
		Index:     affinity.IndexOptions{TTL: in.opts.PrefixCacheTTL, DefaultCapacity: in.opts.PrefixCacheTokens},
	}
	if in.opts.Picker == PickerPrefix {
		o.Chooser = sched.NewCostChooser(1+o.MaxFallbacks, uint64(time.Now().UnixNano()))
	} else {
		o.Chooser = sched.NewLeastLoaded(uint64(time.Now().UnixNano()))
	}
	o.OnEndpoints = in.setEndpoints
}

// setEndpoints is the dispatcher's OnEndpoints hook: the scraper follows
// the endpoint set, and the routed-token series of endpoints that left
// are deleted (the core's and the scraper's per-endpoint series follow
// their state already).
func (in *intel) setEndpoints(eps []sched.Endpoint) {
	in.setTargets(eps)
	live := make(map[string]struct{}, len(eps))
	for _, e := range eps {
		live[e.Addr] = struct{}{}
	}
	in.live.Store(&live)
	in.routedTo.Retain(func(ep string) bool { return has(live, ep) }, func(ep string) {
		in.promptTokens.DeleteLabelValues(ep)
		in.cachedTokens.DeleteLabelValues(ep)
	})
}

// attach connects the built dispatcher: the scraper delivers to it, and
// the intelligence's series go to reg.
func (in *intel) attach(d *dispatcher.Dispatcher, reg prometheus.Registerer) error {
	in.disp = d
	if in.opts.ScrapeMetrics {
		s, err := podmetrics.NewScraper(d, in.opts.scrapeOptions(in.log.WithName("scraper")))
		if err != nil {
			return fmt.Errorf("metrics scraper: %w", err)
		}
		in.scraper = s
		if err := reg.Register(s); err != nil {
			return fmt.Errorf("register scraper metrics: %w", err)
		}
	}
	in.promptTokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "laneway_routed_prompt_tokens_total",
		Help: "Prompt tokens of the requests routed to an endpoint.",
	}, []string{"endpoint"})
	in.cachedTokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "laneway_routed_cached_tokens_total",
		Help: "Prompt tokens of the requests routed to an endpoint that the prefix index expected the endpoint to have cached (the cost snapshot's cached tokens).",
	}, []string{"endpoint"})
	in.routedTo = metrics.NewChildren(func(ep string) routedCounters {
		return routedCounters{prompt: in.promptTokens.WithLabelValues(ep), cached: in.cachedTokens.WithLabelValues(ep)}
	})
	pd := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "laneway_pd_decisions_total",
		Help: "Requests routed in a pool with prefill pods, by disaggregation decision: disaggregated (prefilled on a prefill pod, decoded on a decode pod), below_threshold (served whole by a decode pod: uncached tokens at or below the class's threshold), no_prefill_endpoint (would have disaggregated; no prefill pod was eligible).",
	}, []string{"decision"})
	for _, d := range []sched.PDDecision{sched.PDDisaggregated, sched.PDBelowThreshold, sched.PDNoPrefillEndpoint} {
		in.pd[d] = pd.WithLabelValues(d.String())
	}
	lora := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "laneway_lora_affinity_picks_total",
		Help: "Picks for requests whose model is a LoRA adapter, by where the pick stood: running (the adapter runs or waits there, or this picker has a request of it there), room (fewer adapters than max_lora there), any (neither, or the balance guard).",
	}, []string{"outcome"})
	for _, o := range []sched.LoRAOutcome{sched.LoRARunning, sched.LoRARoom, sched.LoRAAny} {
		in.lora[o] = lora.WithLabelValues(o.String())
	}
	return errors.Join(reg.Register(in.promptTokens), reg.Register(in.cachedTokens), reg.Register(pd), reg.Register(lora),
		reg.Register((*intelCollector)(in)))
}

// setTargets is the dispatcher's OnEndpoints hook: scrape what it routes
// to.
func (in *intel) setTargets(eps []sched.Endpoint) {
	if in.scraper == nil {
		return
	}
	ts := make([]podmetrics.Target, 0, len(eps))
	for _, e := range eps {
		if e.Engine != "" {
			if _, err := policy.ParseEngine(e.Engine); err != nil {
				in.log.V(2).Info("unknown engine label; scraping with --engine-type names", "endpoint", e.Addr, "engine", e.Engine, "default", in.engine.String())
			}
		}
		// policy and podmetrics number the engines alike.
		ts = append(ts, podmetrics.Target{Addr: e.Addr, Engine: sched.EngineOf(e.Engine, in.engine)})
	}
	in.scraper.SetTargets(ts)
}

// stop ends the scrape loops.
func (in *intel) stop() {
	if in.scraper != nil {
		in.scraper.Stop()
	}
}

// BlockSize implements RequestHooks.
func (in *intel) BlockSize() int { return in.disp.BlockSize() }

// Routed implements RequestHooks: count the cost snapshot per endpoint,
// log it at debug level (numbers only, never prompt text) and, with
// ForwardPriority, make the body's top-level priority the request's
// (capped) hint in the engine's polarity, or remove it when there is none
// to forward.
func (in *intel) Routed(req *extproc.Request, t *sched.Ticket, g *sched.Grant, at *tokenize.PrioritySpans) []byte {
	ep := g.Endpoints[0]
	if g.PD != sched.PDNone {
		in.pd[g.PD].Inc()
	}
	if g.LoRA != sched.LoRANone {
		in.lora[g.LoRA].Inc()
	}
	// The prompt is computed where it is prefilled: the prefill pod of a
	// disaggregated request.
	prefiller := g.Prefiller()
	if c, ok := in.routedTo.GetIf(cmp.Or(prefiller, ep), in.isLive); ok {
		c.prompt.Add(float64(t.RawISL))
		c.cached.Add(float64(t.Cached))
	}
	if log := in.log.V(4); log.Enabled() {
		log.Info("routed", "endpoint", ep, "prefill", prefiller, "rawISL", t.RawISL, "cachedTokens", t.Cached, "class", t.Class,
			"priority", t.Priority, "hasPriority", t.HasPriority)
	}
	if !in.opts.ForwardPriority || at == nil || len(req.Body) == 0 {
		return nil // nothing to forward it in
	}
	// The picker owns the field: the request's priority as its tenant may
	// have it, or none. A body's own priority would otherwise reach the
	// engine unchecked, past every cap (SPEC §6).
	var body []byte
	ok := true
	if v, fwd := policy.ForwardPriority(g.Engine, t.EffectivePriority()); fwd && t.HasPriority {
		body, ok = splicePriority(req.Body, at, v)
	} else {
		body, ok = dropPriority(req.Body, at)
	}
	if !ok {
		// The spans come from the parse of this very body, so this cannot
		// happen; the request goes unchanged rather than failing.
		in.log.V(4).Info("priority not forwarded: the parser's spans do not fit the body")
		return nil
	}
	return body
}

// isLive reports whether ep is in the endpoint set in force (any, before
// the first).
func (in *intel) isLive(ep string) bool {
	live := in.live.Load()
	return live == nil || has(*live, ep)
}

// has reports whether k is in the set m.
func has(m map[string]struct{}, k string) bool { _, ok := m[k]; return ok }

// intelCollector exposes the dispatcher's per-endpoint intelligence.
type intelCollector intel

var (
	unseenDesc = prometheus.NewDesc("laneway_endpoint_unseen_waiting_requests",
		"Requests waiting in an endpoint's engine beyond those this picker has in flight there: load it did not send, counted as prefill by the busy test.",
		[]string{"endpoint"}, nil)
	indexTokensDesc = prometheus.NewDesc("laneway_endpoint_prefix_index_tokens",
		"Prompt tokens the prefix index expects an endpoint to have cached.", []string{"endpoint"}, nil)
	awaitingDesc = prometheus.NewDesc("laneway_endpoint_awaiting_engine_grants",
		"Grants whose stream ended before a first response byte was reported (a gateway without response phases) and whose prefill the engine's counters have not confirmed yet: still charged to the endpoint's active prefill.",
		[]string{"endpoint"}, nil)
	othersDesc = prometheus.NewDesc("laneway_endpoint_others_on_their_way_tokens",
		"Prompt tokens the busy test counts for other replicas' requests on their way to the endpoint's engine, in proportion to this picker's awaiting grants and its measured share of the engine's arrivals (0 behind gateways that report response phases).",
		[]string{"endpoint"}, nil)
	shareDesc = prometheus.NewDesc("laneway_endpoint_arrival_share",
		"The part of the endpoint's engine's arrivals this picker takes for its own grants when it reconciles the awaiting ones: 0.5 while cold, 1 once the engine's counts have shown it alone twice, then what full windows of a busy engine measure.",
		[]string{"endpoint"}, nil)
	prefillRateDesc = prometheus.NewDesc("laneway_endpoint_prefill_rate_tokens_per_second",
		"The endpoint's prefill rate learned from its engine's prompt-token counter (0 until learned).",
		[]string{"endpoint"}, nil)
)

// Describe implements prometheus.Collector.
func (c *intelCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- unseenDesc
	ch <- indexTokensDesc
	ch <- awaitingDesc
	ch <- othersDesc
	ch <- shareDesc
	ch <- prefillRateDesc
}

// Collect implements prometheus.Collector.
func (c *intelCollector) Collect(ch chan<- prometheus.Metric) {
	s, ok := c.disp.Snapshot()
	if !ok {
		return
	}
	for _, e := range s.Endpoints {
		ch <- prometheus.MustNewConstMetric(unseenDesc, prometheus.GaugeValue, float64(e.UnseenWaiting), e.Addr)
		ch <- prometheus.MustNewConstMetric(indexTokensDesc, prometheus.GaugeValue, float64(e.IndexTokens), e.Addr)
		ch <- prometheus.MustNewConstMetric(awaitingDesc, prometheus.GaugeValue, float64(e.AwaitingEngine), e.Addr)
		ch <- prometheus.MustNewConstMetric(othersDesc, prometheus.GaugeValue, float64(e.OthersOnTheirWay), e.Addr)
		ch <- prometheus.MustNewConstMetric(shareDesc, prometheus.GaugeValue, e.ArrivalShare, e.Addr)
		ch <- prometheus.MustNewConstMetric(prefillRateDesc, prometheus.GaugeValue, e.PrefillRate, e.Addr)
	}
}
