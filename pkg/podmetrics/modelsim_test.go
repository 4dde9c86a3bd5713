package podmetrics_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/laneway-dev/laneway/internal/testbed/modelsim"
	"github.com/laneway-dev/laneway/pkg/podmetrics"
)

// TestParseLiveSimulator parses the /metrics page of a running simulator
// with one request running and one waiting, so the simulator and the parser
// cannot drift apart on names or label layout.
func TestParseLiveSimulator(t *testing.T) {
	cfg := modelsim.DefaultConfig()
	cfg.Host, cfg.Port = "127.0.0.22", 0
	cfg.MaxNumSeqs = 1
	cfg.BlockSize = 32
	cfg.NumGPUBlocks = 512
	cfg.MaxModelLen = 4096
	cfg.TimePerOutputToken = 5 * time.Millisecond
	srv, err := modelsim.New(cfg, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", cfg.Addr())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	base := "http://" + ln.Addr().String()

	// Two streaming requests whose clients go away at the end of the test:
	// the first holds the only slot, the second waits.
	reqCtx, stopReqs := context.WithCancel(context.Background())
	t.Cleanup(func() {
		stopReqs()
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	prompt := make([]int, 1000)
	for i := range prompt {
		prompt[i] = i
	}
	start := func() *http.Response {
		b, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 2000, "stream": true})
		req, _ := http.NewRequestWithContext(reqCtx, http.MethodPost, base+"/v1/completions", bytes.NewReader(b))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	first := start()
	if _, err := bufio.NewReader(first.Body).ReadString('\n'); err != nil {
		t.Fatalf("first token: %v", err)
	}
	start()

	// The waiting request shows up in the metrics without an event to wait
	// for; poll with a deadline.
	var m podmetrics.Metrics
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if m, err = podmetrics.Parse(podmetrics.EngineVLLM, page); err != nil {
			t.Fatalf("Parse: %v", err)
		}
		if m.Waiting == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	want := podmetrics.Waiting | podmetrics.Running | podmetrics.KVCacheUsage | podmetrics.BlockSize | podmetrics.NumBlocks | podmetrics.PromptTokens |
		podmetrics.GenerationTokens | podmetrics.Finished
	if m.Known != want {
		t.Fatalf("known fields %v, want %v", m.Known, want)
	}
	// One request holds ceil((1000+2000)/32) = 94 of 512 blocks.
	if m.Waiting != 1 || m.Running != 1 || m.BlockSize != 32 || m.NumBlocks != 512 || m.KVCacheUsage != 94.0/512 {
		t.Fatalf("metrics %+v: want 1 waiting, 1 running, blocks 32x512, usage %v", m, 94.0/512)
	}
}
