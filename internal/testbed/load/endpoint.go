package load

import (
	"fmt"
	"net"
	"net/http"
	"time"
)

// idleVLLMPage is the /metrics page of a vLLM engine with nothing to do
// (SPEC §9 names): nothing waiting or running, an empty KV cache.
const idleVLLMPage = `# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="loadgen"} 0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="loadgen"} 0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="loadgen"} 0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="65536"} 1
`

// IdleEndpoint is a stand-in model server for load runs: it serves an idle
// engine's /metrics page so a scraping picker sees a fresh, idle endpoint,
// and answers anything else with 404 (the load tool never forwards
// requests; it plays the upstream's response itself).
type IdleEndpoint struct {
	ln  net.Listener
	srv *http.Server
}

// StartIdleEndpoint listens on 127.0.0.2 (127.0.0.1 where only that
// loopback address exists) on a free port.
func StartIdleEndpoint() (*IdleEndpoint, error) {
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("idle endpoint listener: %w", err)
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("content-type", "text/plain; version=0.0.4")
		_, _ = w.Write([]byte(idleVLLMPage))
	})
	e := &IdleEndpoint{ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}}
	go func() { _ = e.srv.Serve(ln) }() // returns ErrServerClosed at Close
	return e, nil
}

// Addr is the endpoint's "ip:port".
func (e *IdleEndpoint) Addr() string { return e.ln.Addr().String() }

// Close stops the endpoint.
func (e *IdleEndpoint) Close() error { return e.srv.Close() }
