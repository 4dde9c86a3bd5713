package modelsim

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestDisaggregatedRequest: a decode server given x-prefiller-host-port
// prefills on that server with max_tokens 1, waits the KV transfer, and
// decodes with the prompt cached; the records of both name each other's
// part and share the request id.
func TestDisaggregatedRequest(t *testing.T) {
	pre := startSim(t, func(c *Config) { c.Role = RolePrefill })
	dec := startSim(t, func(c *Config) {
		c.Role = RoleDecode
		c.KVTransferTime = 40 * time.Millisecond
		c.PrefillTokensPerSec = 1000 // a local prefill of 300 tokens would take 300 ms
	})
	preAddr := strings.TrimPrefix(pre.base, "http://")
	body, _ := json.Marshal(map[string]any{"model": "sim-model", "prompt": ids(300, 1), "max_tokens": 4, "stream": true})
	req, _ := http.NewRequest(http.MethodPost, dec.base+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(PrefillerHeader, preAddr)
	req.Header.Set(RequestIDHeader, "req-7")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(out), "[DONE]") {
		t.Fatalf("status %d: %s", resp.StatusCode, out)
	}
	if took < 40*time.Millisecond || took > 250*time.Millisecond {
		t.Errorf("took %v: want the KV transfer (40 ms) and no local prefill of the prompt (300 ms)", took)
	}
	pr, dr := pre.debug(t), dec.debug(t)
	if len(pr.Records) != 1 || len(dr.Records) != 1 {
		t.Fatalf("records: prefill %d, decode %d; want one each", len(pr.Records), len(dr.Records))
	}
	p, d := pr.Records[0], dr.Records[0]
	if pr.Role != RolePrefill || !p.RemoteDecode || p.MaxTokens != 1 || p.RequestID != "req-7" || p.PrefilledBy != "" {
		t.Errorf("prefill record %+v (role %s), want a remote-decode prefill of max_tokens 1 for req-7", p, pr.Role)
	}
	if d.PrefilledBy != preAddr || d.RequestID != "req-7" || d.CachedTokens != 299 || d.MaxTokens != 4 || d.Generated != 4 {
		t.Errorf("decode record %+v, want prefilled by %s with 299 tokens cached, 4 generated", d, preAddr)
	}
	if n := value(t, dec.scrape(t), "modelsim_remote_prefills_total"); n != 1 {
		t.Errorf("modelsim_remote_prefills_total = %v, want 1", n)
	}
}

// TestDisaggregatedPrefillFails: a prefill pod that cannot be reached is a
// 502 naming it; a prefill server ignores the header and serves the
// request itself.
func TestDisaggregatedPrefillFails(t *testing.T) {
	dec := startSim(t, func(c *Config) { c.Role = RoleDecode })
	body, _ := json.Marshal(map[string]any{"prompt": ids(20, 1), "max_tokens": 2})
	req, _ := http.NewRequest(http.MethodPost, dec.base+"/v1/completions", bytes.NewReader(body))
	req.Header.Set(PrefillerHeader, "127.0.0.1:1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(msg), "127.0.0.1:1") {
		t.Errorf("status %d %s, want 502 naming the prefill pod", resp.StatusCode, msg)
	}

	pre := startSim(t, func(c *Config) { c.Role = RolePrefill })
	req, _ = http.NewRequest(http.MethodPost, pre.base+"/v1/completions", bytes.NewReader(body))
	req.Header.Set(PrefillerHeader, "127.0.0.1:1")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || pre.debug(t).Records[0].PrefilledBy != "" {
		t.Errorf("prefill server: status %d, want the request served locally", resp.StatusCode)
	}
}

// TestLoRALoadsMetric: loads of adapters not resident are counted, and a
// resident adapter costs none.
func TestLoRALoadsMetric(t *testing.T) {
	s := startSim(t, func(c *Config) {
		c.LoRAAdapters = []string{"a", "b"}
		c.MaxLoRAs = 1
		c.LoRALoadTime = 5 * time.Millisecond
	})
	for _, m := range []string{"a", "a", "b", "a", "sim-model"} {
		resp := s.post(t, "/v1/completions", map[string]any{"model": m, "prompt": ids(16, 1), "max_tokens": 1})
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d", m, resp.StatusCode)
		}
	}
	if n := value(t, s.scrape(t), "modelsim_lora_loads_total"); n != 3 {
		t.Errorf("modelsim_lora_loads_total = %v, want 3 (a, b, a again)", n)
	}
}
