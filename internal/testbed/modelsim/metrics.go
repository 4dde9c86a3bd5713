package modelsim

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics holds the simulator's series, named as vLLM names them (SPEC §9)
// so the picker's scraper reads the simulator as it reads vLLM.
type metrics struct {
	reg *prometheus.Registry

	kvUsage          prometheus.Gauge
	maxRunning       prometheus.Gauge
	prefixQueries    prometheus.Counter
	prefixHits       prometheus.Counter
	promptTokens     prometheus.Counter
	generationTokens prometheus.Counter
	success          prometheus.Counter
	aborted          prometheus.Counter
	loraLoads        prometheus.Counter
	remotePrefills   *prometheus.CounterVec
	ttft             prometheus.Observer
	e2e              prometheus.Observer
	queueTime        prometheus.Observer

	loraMu      sync.Mutex
	lora        *prometheus.GaugeVec
	maxLoRA     string
	loraHistory [][2]string // label pairs with a series, oldest first
}

// loraSeriesKept is how many lora_requests_info series stay exposed. vLLM
// never deletes old ones, which is why readers take the newest; keeping a
// few shows that behaviour without growing without bound.
const loraSeriesKept = 4

// latencyBuckets spans a sped-up test (milliseconds) to a long generation.
var latencyBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}

func newMetrics(cfg Config, waiting, running func() float64) *metrics {
	reg := prometheus.NewRegistry()
	model := prometheus.Labels{"model_name": cfg.Model}
	f := func(c prometheus.Collector) { reg.MustRegister(c) }
	m := &metrics{reg: reg, maxLoRA: strconv.Itoa(cfg.MaxLoRAs)}

	f(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vllm:num_requests_waiting",
		Help: "Number of requests waiting to be processed.", ConstLabels: model}, waiting))
	f(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vllm:num_requests_running",
		Help: "Number of requests in model execution batches.", ConstLabels: model}, running))
	m.kvUsage = prometheus.NewGauge(prometheus.GaugeOpts{Name: "vllm:kv_cache_usage_perc",
		Help: "KV-cache usage. 1 means 100 percent usage.", ConstLabels: model})
	f(m.kvUsage)
	info := prometheus.NewGauge(prometheus.GaugeOpts{Name: "vllm:cache_config_info",
		Help: "Information of the LLMEngine CacheConfig.",
		ConstLabels: prometheus.Labels{
			"block_size":            strconv.Itoa(cfg.BlockSize),
			"num_gpu_blocks":        strconv.Itoa(cfg.NumGPUBlocks),
			"enable_prefix_caching": strconv.FormatBool(cfg.EnablePrefixCaching),
		}})
	info.Set(1)
	f(info)
	m.prefixQueries = prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:prefix_cache_queries_total",
		Help: "Prefix cache queries, in terms of number of queried tokens.", ConstLabels: model})
	f(m.prefixQueries)
	m.prefixHits = prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:prefix_cache_hits_total",
		Help: "Prefix cache hits, in terms of number of cached tokens.", ConstLabels: model})
	f(m.prefixHits)
	m.promptTokens = prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:prompt_tokens_total",
		Help: "Number of prefill tokens processed.", ConstLabels: model})
	f(m.promptTokens)
	m.generationTokens = prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:generation_tokens_total",
		Help: "Number of generation tokens processed.", ConstLabels: model})
	f(m.generationTokens)
	success := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:request_success_total",
		Help: "Count of successfully processed requests.", ConstLabels: model}, []string{"finished_reason"})
	f(success)
	m.success = success.WithLabelValues("length")
	m.aborted = prometheus.NewCounter(prometheus.CounterOpts{Name: "modelsim_requests_aborted_total",
		Help: "Requests whose client went away before the last token.", ConstLabels: model})
	f(m.aborted)
	m.loraLoads = prometheus.NewCounter(prometheus.CounterOpts{Name: "modelsim_lora_loads_total",
		Help: "LoRA adapters loaded into a slot (each costs --lora-load-time).", ConstLabels: model})
	f(m.loraLoads)
	m.remotePrefills = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "modelsim_remote_prefills_total",
		Help: "Disaggregated requests this server decoded, by the outcome of their prefill on the prefill pod (ok, error).", ConstLabels: model},
		[]string{"outcome"})
	f(m.remotePrefills)
	for _, o := range []string{"ok", "error"} {
		m.remotePrefills.WithLabelValues(o)
	}
	m.maxRunning = prometheus.NewGauge(prometheus.GaugeOpts{Name: "modelsim_max_num_requests_running",
		Help: "Largest number of requests that ran at once since start.", ConstLabels: model})
	f(m.maxRunning)
	hist := func(name, help string) prometheus.Observer {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: model, Buckets: latencyBuckets})
		f(h)
		return h
	}
	m.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.")
	m.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.")
	m.queueTime = hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.")
	if cfg.MaxLoRAs > 0 {
		m.lora = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vllm:lora_requests_info",
			Help: "Running stats on lora requests."}, []string{"running_lora_adapters", "waiting_lora_adapters", "max_lora"})
		f(m.lora)
		m.setLoRA("", "", time.Now())
	}
	return m
}

// setLoRA records the adapters running and waiting now, as vLLM does: a
// series per label combination whose value is the time it was last current.
func (m *metrics) setLoRA(running, waiting string, now time.Time) {
	m.loraMu.Lock()
	defer m.loraMu.Unlock()
	pair := [2]string{running, waiting}
	for i, p := range m.loraHistory {
		if p == pair {
			m.loraHistory = append(m.loraHistory[:i], m.loraHistory[i+1:]...)
			break
		}
	}
	m.loraHistory = append(m.loraHistory, pair)
	if len(m.loraHistory) > loraSeriesKept {
		old := m.loraHistory[0]
		m.loraHistory = m.loraHistory[1:]
		m.lora.DeleteLabelValues(old[0], old[1], m.maxLoRA)
	}
	m.lora.WithLabelValues(running, waiting, m.maxLoRA).Set(float64(now.UnixNano()) / 1e9)
}
