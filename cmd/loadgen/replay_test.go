package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/laneway-dev/laneway/internal/testbed/gateway"
	"github.com/laneway-dev/laneway/pkg/tokenize"
)

const excerpt = "../../internal/testbed/simulate/testdata/mooncake_excerpt.jsonl"

func TestReplayUsage(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		code int
		out  string
	}{
		{"no target", []string{"--trace", excerpt}, 2, "give --spawn or --gateway URL"},
		{"both targets", []string{"--trace", excerpt, "--spawn", "--gateway", "http://x"}, 2, "give --spawn or --gateway URL"},
		{"two policies", []string{"--trace", excerpt, "--spawn", "--policy", "none", "--policy", "a.yaml"}, 2, "one --policy per real run"},
		{"round-robin", []string{"--trace", excerpt, "--spawn", "--policy", "round-robin"}, 2, "no round-robin"},
		{"retries", []string{"--trace", excerpt, "--spawn", "--retry-429", "2"}, 2, "does not retry"},
		{"spawn flags without spawn", []string{"--trace", excerpt, "--gateway", "http://x", "--epp-args", "--v=4"}, 2, "go with --spawn"},
		{"header-only without spawn", []string{"--trace", excerpt, "--gateway", "http://x", "--response-phases=false"}, 2, "they go with --spawn"},
		{"shim with response phases", []string{"--trace", excerpt, "--spawn", "--epp-conn-per-request"}, 2, "goes with --response-phases=false"},
		{"endpoints with spawn", []string{"--trace", excerpt, "--spawn", "--endpoints", "a:1"}, 2, "--endpoints goes with --gateway"},
		{"unknown flag", []string{"--trace", excerpt, "--rate", "5"}, 2, "unknown flag: --rate"},
		{"stray argument", []string{"--trace", excerpt, "--spawn", "x"}, 2, `unexpected argument "x"`},
		{"bad trace", []string{"--trace", "nothing.jsonl", "--gateway", "http://127.0.0.1:1"}, 1, "read trace"},
		{"help", []string{"--trace", excerpt, "--help"}, 0, "--time-scale"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := runReplay(context.Background(), tt.args, &stdout, &stderr)
			if code != tt.code || !strings.Contains(stdout.String()+stderr.String(), tt.out) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want %d and %q", code, stdout.String(), stderr.String(), tt.code, tt.out)
			}
		})
	}
}

// TestReplayThroughGateway replays the Mooncake excerpt, a thousand times
// faster, against a stand-in for the gateway and checks the outputs are
// laneway simulate's: the table, summary.json and requests.jsonl with one
// line per request in trace order, servers numbered by --endpoints.
func TestReplayThroughGateway(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		prompt, err := tokenize.ExtractPrompt(nil, body)
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		w.Header().Set(gateway.HeaderServedBy, "127.0.0.9:2")
		io.WriteString(w, "data: {\"choices\":[{\"text\":\" a\"}]}\n\n")
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\ndata: [DONE]\n\n", len(prompt)/4)
	}))
	defer srv.Close()
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := runReplay(context.Background(), []string{"--trace", excerpt, "--time-scale", "0.001", "--gateway", srv.URL,
		"--endpoints", "127.0.0.9:1,127.0.0.9:2", "--assign-class", "length:short<3000,long", "--no-plots", "--out", out}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	for _, want := range []string{"TTFT p50/p90/p99 ms", "none", "short", "long", "real run: prefix hit rate 2"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
		}
	}
	var sum struct {
		Trace struct {
			Requests int `json:"requests"`
		} `json:"trace"`
		Policies []struct {
			Policy string `json:"policy"`
			Total  struct {
				Completed int `json:"completed"`
			} `json:"total"`
			PrefixHitRate float64 `json:"prefix_hit_rate"`
		} `json:"policies"`
	}
	b := readSummary(t, out, &sum)
	if sum.Trace.Requests != 8 || len(sum.Policies) != 1 || sum.Policies[0].Policy != "none" || sum.Policies[0].Total.Completed != 8 ||
		sum.Policies[0].PrefixHitRate < 0.24 || sum.Policies[0].PrefixHitRate > 0.25 {
		t.Fatalf("summary %s", b)
	}
	f, err := os.Open(filepath.Join(out, "none", "requests.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	n := 0
	for ; sc.Scan(); n++ {
		var line struct {
			ID           int      `json:"id"`
			Class        string   `json:"class"`
			Status       int      `json:"status"`
			Server       *int     `json:"server"`
			FirstTokenMS *float64 `json:"first_token_ms"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatal(err)
		}
		if line.ID != n || line.Status != 200 || line.Server == nil || *line.Server != 1 || line.FirstTokenMS == nil || (line.Class != "short" && line.Class != "long") {
			t.Errorf("line %d: %s", n, sc.Bytes())
		}
	}
	if n != 8 {
		t.Fatalf("%d lines, want 8", n)
	}
}

// TestReplaySpawnHeaderOnly: --spawn with --response-phases=false and
// --epp-conn-per-request replays through a gateway that plays NGINX
// Gateway Fabric's endpoint-picker shim (its log says so), every request
// is answered, the first-N split follows the quanta, and the run reports
// the engine's largest waiting queue. A small SPEC §11 workload: 40
// prompts of 512 tokens per class, 512:128.
func TestReplaySpawnHeaderOnly(t *testing.T) {
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := runReplay(context.Background(), []string{
		"--generate", "class=premium,arrival=once,count=40,prompt=512,output=1;class=regular,arrival=once,count=40,prompt=512,output=1",
		"--policy", "../../config/samples/policy-premium-regular.yaml",
		"--servers", "1", "--max-num-seqs", "4", "--enable-prefix-caching=false", "--prefill-tokens-per-sec", "40000", "--time-per-output-token", "10ms",
		"--spawn", "--response-phases=false", "--epp-conn-per-request", "--no-plots", "--out", out}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	t.Logf("stdout:\n%s", stdout.String())
	var waiting, samples int
	found := false
	for _, line := range strings.Split(stdout.String(), "\n") {
		if _, err := fmt.Sscanf(line, "real run: server 0: engine waiting queue at most %d requests over %d samples", &waiting, &samples); err == nil {
			found = true
		}
	}
	if !found || samples == 0 {
		t.Errorf("stdout lacks server 0's engine waiting maximum (found %t, %d samples)", found, samples)
	}
	if !strings.Contains(stdout.String(), "real run: gateway nginx-shim") {
		t.Errorf("stdout does not name the gateway's shape nginx-shim")
	}
	log, err := os.ReadFile(filepath.Join(out, "logs", "gateway.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), `"shape":"nginx-shim"`) {
		t.Errorf("the gateway did not run as the NGINX shim:\n%s", log)
	}
	var sum struct {
		Policies []struct {
			Classes []struct {
				Class     string `json:"class"`
				Completed int    `json:"completed"`
				FirstN    int    `json:"first_n"`
			} `json:"classes"`
		} `json:"policies"`
	}
	b := readSummary(t, out, &sum)
	got := map[string][2]int{}
	for _, c := range sum.Policies[0].Classes {
		got[c.Class] = [2]int{c.Completed, c.FirstN}
	}
	// Of the first 40, the 4:1 quanta give premium about 32.
	if got["premium"][0] != 40 || got["regular"][0] != 40 || got["premium"][1] < 28 {
		t.Fatalf("classes (completed, first N): %v, want 40 each and premium >= 28 of the first 40\n%s", got, b)
	}
}

// readSummary decodes a run's DIR/summary.json into v and returns its
// bytes (for failure messages).
func readSummary(t *testing.T, dir string, v any) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
	return b
}
