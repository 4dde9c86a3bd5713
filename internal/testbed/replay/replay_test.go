package replay

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/internal/testbed/gateway"
	"github.com/laneway-dev/laneway/internal/testbed/simulate"
	"github.com/laneway-dev/laneway/pkg/engine"
	"github.com/laneway-dev/laneway/pkg/policy"
	"github.com/laneway-dev/laneway/pkg/sched"
	"github.com/laneway-dev/laneway/pkg/tokenize"
)

const excerpt = "../simulate/testdata/mooncake_excerpt.jsonl"

// load reads the excerpt as `laneway simulate` would, a thousand times
// faster (90 s of arrivals in 90 ms), with classes by length.
func load(t *testing.T, policies ...string) *simulate.Setup {
	t.Helper()
	c := simulate.DefaultConfig()
	c.Trace, c.TimeScale, c.AssignClass, c.Policies = excerpt, 0.001, "length:short<3000,long", policies
	s, err := c.Load()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// seen is one request as the fake gateway received it.
type seen struct {
	at     time.Duration
	class  string
	tenant string
	prompt []uint32
	usage  bool
	stream bool
	model  string
}

// fakeGateway answers like the local gateway in front of modelsim: the
// served-by header, one data event per token, a usage event with the
// cached tokens, [DONE]. Requests whose prompt is shorter than 2,000
// tokens get 429 from the "picker"; request prompts of 7,833 tokens break
// off after their first token.
func fakeGateway(t *testing.T, begin *time.Time, mu *sync.Mutex, got map[[2]int]seen) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var b struct {
			Model         string
			Stream        bool
			StreamOptions struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
			MaxTokens int `json:"max_tokens"`
		}
		if err := json.Unmarshal(body, &b); err != nil {
			t.Errorf("body: %v", err)
			http.Error(w, "bad", 400)
			return
		}
		prompt, err := tokenize.ExtractPrompt(nil, body)
		if err != nil {
			t.Errorf("prompt: %v", err)
		}
		mu.Lock()
		got[[2]int{len(prompt), b.MaxTokens}] = seen{at: time.Since(*begin), class: r.Header.Get(policy.HeaderPolicyClass), tenant: r.Header.Get(policy.TenantHeader),
			prompt: prompt, usage: b.StreamOptions.IncludeUsage, stream: b.Stream, model: b.Model}
		mu.Unlock()
		if r.URL.Path != "/v1/completions" {
			t.Errorf("path %s", r.URL.Path)
		}
		if len(prompt) < 2000 {
			w.Header().Set("x-laneway-reason", "queue_full")
			http.Error(w, "full", http.StatusTooManyRequests)
			return
		}
		w.Header().Set(gateway.HeaderServedBy, fmt.Sprintf("10.0.0.%d:8000", len(prompt)%3))
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		fl.Flush()
		for i := range b.MaxTokens {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\" w%d\"}],\"usage\":null}\n\n", i)
			fl.Flush()
			if len(prompt) == 7833 {
				return // broken off
			}
		}
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n", len(prompt), len(prompt)/2)
		io.WriteString(w, "data: [DONE]\n\n")
	}))
}

// TestRun replays the Mooncake excerpt against a fake gateway and checks
// what went out (the prompts the simulator hashes, the hints, open-loop
// arrivals) and what came back (statuses, servers, hits, classes, times).
func TestRun(t *testing.T) {
	s := load(t)
	var mu sync.Mutex
	got := map[[2]int]seen{}
	var begin time.Time
	srv := fakeGateway(t, &begin, &mu, got)
	defer srv.Close()
	var progress []int
	begin = time.Now()
	res, err := Run(context.Background(), s.Trace, s.Policies[0], Options{URL: srv.URL, Servers: []string{"10.0.0.2:8000"},
		Progress: func(done, total int) { progress = append(progress, done, total) }})
	if err != nil {
		t.Fatal(err)
	}
	if len(progress) < 2 || !slices.Equal(progress[len(progress)-2:], []int{8, 8}) {
		t.Fatalf("progress %v, want to end at 8 of 8", progress)
	}
	if len(got) != 8 {
		t.Fatalf("the gateway saw %d requests, want 8", len(got))
	}
	for i, q := range s.Trace.Requests {
		g := got[[2]int{q.PromptTokens, q.OutputTokens}]
		if !slices.Equal(g.prompt, s.Trace.AppendPrompt(nil, i)) {
			t.Fatalf("request %d: the prompt sent is not the trace's", i)
		}
		if !g.stream || !g.usage || g.model != DefaultModel || g.class != q.Class || g.tenant != "" {
			t.Errorf("request %d went out with stream %t, usage %t, model %q, class %q, tenant %q", i, g.stream, g.usage, g.model, g.class, g.tenant)
		}
		if g.at < time.Duration(q.Arrival) {
			t.Errorf("request %d was sent %v into the run, before its arrival %v", i, g.at, time.Duration(q.Arrival))
		}
		o := res.Outcomes[i]
		if o.Leave < q.Arrival || o.Attempts != 1 {
			t.Errorf("request %d: left at %d, arrived %d, %d attempts", i, o.Leave, q.Arrival, o.Attempts)
		}
		if o.Prefill != -1 { // a real run does not learn a prefill server
			t.Errorf("request %d: prefill server %d, want none (-1)", i, o.Prefill)
		}
		if want := res.Classes[o.Class]; want != q.Class {
			t.Errorf("request %d: class %q, header %q", i, want, q.Class)
		}
		switch {
		case q.PromptTokens < 2000:
			if o.Status != 429 || o.Server != -1 || o.First != -1 || o.End != -1 {
				t.Errorf("request %d (429): %+v", i, o)
			}
		case q.PromptTokens == 7833:
			if o.Status != StatusBroken || o.First < o.Leave || o.End != -1 {
				t.Errorf("request %d (broken off): %+v", i, o)
			}
		default:
			if o.Status != 200 || o.EngineCached != uint32(q.PromptTokens/2) || o.Cached != o.EngineCached ||
				o.First < o.Leave || o.End < o.First || o.Start != -1 {
				t.Errorf("request %d (%d tokens): %+v", i, q.PromptTokens, o)
			}
			// 10.0.0.2 is listed (index 0); 10.0.0.0 is numbered when
			// first seen.
			if want := map[int]int32{7322: 0, 2651: 0, 3024: 1, 2103: 1}[q.PromptTokens]; o.Server != want {
				t.Errorf("request %d (%d tokens): server %d, want %d", i, q.PromptTokens, o.Server, want)
			}
		}
	}
	sum := simulate.Summarize(s.Trace, res)
	if sum.Total.Completed != 4 || sum.Total.Rejected429 != 3 || sum.PrefixHitRate <= 0.49 || sum.PrefixHitRate > 0.5 {
		t.Fatalf("summary: %d completed, %d 429s, hit rate %v", sum.Total.Completed, sum.Total.Rejected429, sum.PrefixHitRate)
	}
}

// TestRunTransportError: a gateway that is not there fails every request
// at the transport; the result still says what happened.
func TestRunTransportError(t *testing.T) {
	s := load(t)
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	res, err := Run(context.Background(), s.Trace, s.Policies[0], Options{URL: url})
	if err == nil || !strings.Contains(err.Error(), "8 of 8 requests failed at the transport") {
		t.Fatalf("err %v", err)
	}
	for i, o := range res.Outcomes {
		if o.Status != 0 || o.Leave != -1 {
			t.Fatalf("request %d: %+v", i, o)
		}
	}
}

// TestRunCancelled: a cancelled replay returns at once with ctx's error.
func TestRunCancelled(t *testing.T) {
	c := simulate.DefaultConfig()
	c.Trace = excerpt // 90 s of arrivals
	s, err := c.Load()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", http.StatusServiceUnavailable) }))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, s.Trace, s.Policies[0], Options{URL: srv.URL}); err != context.Canceled {
		t.Fatalf("err %v, want context.Canceled", err)
	}
}

func TestBodyAndHeaders(t *testing.T) {
	tr, err := simulate.ReadJSONL(strings.NewReader(
		`{"arrival_ms": 0, "prompt_tokens": 3, "output_tokens": 2, "class": "gold", "tenant": "acme", "priority": -4, "strict_priority": 2}`), "t")
	if err != nil {
		t.Fatal(err)
	}
	body := Body(tr, 0, "m")
	ids := tr.AppendPrompt(nil, 0)
	want := fmt.Sprintf(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":2,"prompt":[%d,%d,%d]}`, ids[0], ids[1], ids[2])
	if string(body) != want {
		t.Fatalf("body %s\nwant %s", body, want)
	}
	h := http.Header{}
	SetHeaders(h, &tr.Requests[0])
	for k, v := range map[string]string{policy.HeaderPolicyClass: "gold", policy.TenantHeader: "acme", policy.HeaderPriority: "-4", policy.HeaderStrictPriority: "2"} {
		if h.Get(k) != v {
			t.Errorf("%s: %q, want %q", k, h.Get(k), v)
		}
	}
}

func TestServerArgs(t *testing.T) {
	e := engine.DefaultConfig()
	e.NumGPUBlocks, e.Speedup = 1000, 4
	args := ServerArgs(e)
	for _, want := range []string{"--num-gpu-blocks=1000", "--block-size=16", "--max-model-len=16000", "--speedup=4", "--enable-prefix-caching=true"} {
		if !slices.Contains(args, want) {
			t.Errorf("args %v lack %s", args, want)
		}
	}
}

// TestRoleArgs: a P/D fleet's servers start with their roles and their KV
// transfer wait (scaled so modelsim's division by the speedup gives the
// simulated wait), and the picker learns the roles from an endpoints file;
// a fleet without roles passes neither.
func TestRoleArgs(t *testing.T) {
	e := engine.DefaultConfig()
	e.Speedup = 4
	fl := &simulate.Fleet{Servers: []simulate.Server{
		{Engine: e, Role: sched.RolePrefill},
		{Engine: e, Role: sched.RoleDecode, KVTransferTime: 20 * time.Millisecond},
		{Engine: e},
	}}
	for i, want := range [][]string{{"--role=prefill"}, {"--role=decode", "--kv-transfer-time=80ms"}, nil} {
		if got := RoleArgs(fl.Servers[i]); !slices.Equal(got, want) {
			t.Errorf("server %d: %v, want %v", i, got, want)
		}
	}
	addrs := []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}
	if got, want := EndpointsFile(fl, addrs), "127.0.0.1:1 prefill\n127.0.0.1:2 decode\n127.0.0.1:3 prefill-decode\n"; got != want {
		t.Errorf("endpoints file %q, want %q", got, want)
	}
	if got := EndpointsFile(&simulate.Fleet{Servers: fl.Servers[2:]}, addrs[2:]); got != "" {
		t.Errorf("a fleet without roles: endpoints file %q, want none", got)
	}
}
