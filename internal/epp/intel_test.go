package epp

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spf13/pflag"

	"github.com/laneway-dev/laneway/internal/dispatcher"
	"github.com/laneway-dev/laneway/pkg/extproc"
	"github.com/laneway-dev/laneway/pkg/policy"
	"github.com/laneway-dev/laneway/pkg/tokenize"
)

func TestSetTopLevelInt(t *testing.T) {
	cases := []struct {
		name, in, want string
		v              int64
		err            bool
	}{
		{"insert into object", `{"model":"m","prompt":"hi"}`, `{"priority":-5,"model":"m","prompt":"hi"}`, -5, false},
		{"insert into empty object", ` { } `, ` {"priority":3 } `, 3, false},
		{"replace keeps the rest byte for byte", `{"a": 1.50e0, "priority" : 7 ,"z":[1, {"priority":9}]}`, `{"a": 1.50e0, "priority" : 12 ,"z":[1, {"priority":9}]}`, 12, false},
		{"nested members are not touched", `{"nvext":{"priority":1},"x":"priority"}`, `{"priority":-2147483648,"nvext":{"priority":1},"x":"priority"}`, -2147483648, false},
		{"replace every duplicate", `{"priority":1,"b":{},"priority":"x"}`, `{"priority":4,"b":{},"priority":4}`, 4, false},
		{"escaped key", `{"priorit\u0079":null}`, `{"priorit\u0079":0}`, 0, false},
		{"strings with braces and escapes", `{"s":"}\"{[","priority":[1,2]}`, `{"s":"}\"{[","priority":5}`, 5, false},
		{"not an object", `[1,2]`, ``, 1, true},
		{"empty", ``, ``, 1, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := setTopLevelInt([]byte(tc.in), "priority", tc.v)
			if (err != nil) != tc.err {
				t.Fatalf("err = %v, want error %v", err, tc.err)
			}
			if tc.err {
				return
			}
			if string(got) != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
			var m map[string]any
			if err := json.Unmarshal(got, &m); err != nil {
				t.Fatalf("result is not JSON: %v", err)
			}
			if p, ok := m["priority"].(float64); !ok || int64(p) != tc.v {
				t.Errorf("decoded priority %v, want %d", m["priority"], tc.v)
			}
		})
	}
}

func TestParseBlocksHashesLikeTheSimulator(t *testing.T) {
	body := []byte(`{"model":"m","prompt":"` + strings.Repeat("the quick brown fox jumps over the lazy dog ", 40) + `","nvext":{"agent_hints":{"priority":3}}}`)
	toks, err := tokenize.ExtractPrompt(nil, body)
	if err != nil {
		t.Fatal(err)
	}
	var tk dispatcher.Ticket
	if err := (BodyParser{}).ParseBlocks(&extproc.Request{Body: body}, &tk, 16, make([]uint64, 0, 4)); err != nil {
		t.Fatal(err)
	}
	want := tokenize.BlockHashes(toks, 16)
	if tk.RawISL != uint64(len(toks)) || tk.BlockSize != 16 || len(tk.Blocks) != len(want) {
		t.Fatalf("ticket raw %d bs %d with %d blocks, want %d tokens in %d blocks of 16", tk.RawISL, tk.BlockSize, len(tk.Blocks), len(toks), len(want))
	}
	for i := range want {
		if tk.Blocks[i] != want[i] {
			t.Fatalf("block %d hash differs from tokenize.BlockHashes", i)
		}
	}
	if !tk.HasPriority || tk.Priority != 3 {
		t.Errorf("priority %d (has %v), want the hint 3", tk.Priority, tk.HasPriority)
	}
	var plain dispatcher.Ticket
	if err := (BodyParser{}).Parse(&extproc.Request{Body: body}, &plain); err != nil || plain.Blocks != nil || plain.RawISL != tk.RawISL {
		t.Errorf("Parse: %v, blocks %v, raw %d: want no hashes and the same count", err, plain.Blocks, plain.RawISL)
	}
}

// countingTokenizer checks that the parser uses the configured Tokenizer.
type countingTokenizer struct{ n int }

func (c *countingTokenizer) AppendPromptTokens(dst []uint32, _ []byte) ([]uint32, error) {
	for i := range c.n {
		dst = append(dst, uint32(i))
	}
	return dst, nil
}

func TestBodyParserUsesItsTokenizer(t *testing.T) {
	var tk dispatcher.Ticket
	p := BodyParser{Tokenizer: &countingTokenizer{n: 40}}
	if err := p.ParseBlocks(&extproc.Request{Body: []byte(`{"model":"m","prompt":"x"}`)}, &tk, 16, nil); err != nil {
		t.Fatal(err)
	}
	if tk.RawISL != 40 || len(tk.Blocks) != 2 {
		t.Fatalf("raw %d, %d blocks; want 40 tokens from the tokenizer in 2 full blocks", tk.RawISL, len(tk.Blocks))
	}
}

// newTestIntel builds the intelligence around a running dispatcher with
// one endpoint of the given engine, scraping off.
func newTestIntel(t *testing.T, args ...string) (*Handler, *intel, *prometheus.Registry) {
	t.Helper()
	o := NewOptions()
	fs := pflag.NewFlagSet("epp", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(append([]string{"--scrape-metrics=false"}, args...)); err != nil {
		t.Fatal(err)
	}
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	in := newIntel(o, logr.Discard())
	var dopts dispatcher.Options
	in.configure(&dopts)
	c, err := (&policy.Config{}).Compile()
	if err != nil {
		t.Fatal(err)
	}
	d, err := dispatcher.New(dispatcher.FromCompiled(c), dopts)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := in.attach(d, reg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; in.stop() })
	d.SetEndpoints([]dispatcher.Endpoint{{Addr: "127.0.0.2:8000"}, {Addr: "127.0.0.3:8000", Engine: "sglang"}, {Addr: "127.0.0.4:8000", Engine: "trtllm"}})
	return &Handler{Parser: BodyParser{}, Dispatcher: d, Hooks: in}, in, reg
}

func TestPriorityForwarding(t *testing.T) {
	const withHint = `{"model":"m","prompt":[1,2,3],"nvext":{"agent_hints":{"priority":5,"strict_priority":2}}}`
	const noHint = `{"model":"m","prompt":[1,2,3],"priority":9}`
	cases := []struct {
		name     string
		args     []string
		body     string
		header   string
		endpoint string
		want     string // "" means the body goes unchanged
	}{
		{"vLLM gets the negation", []string{"--forward-priority"}, withHint, "", "127.0.0.2:8000", `{"priority":-5,` + withHint[1:]},
		{"SGLang gets it as is", []string{"--forward-priority"}, withHint, "", "127.0.0.3:8000", `{"priority":5,` + withHint[1:]},
		{"TRT-LLM gets none", []string{"--forward-priority"}, withHint, "", "127.0.0.4:8000", ""},
		{"header hint overrides the body", []string{"--forward-priority"}, withHint, "-3", "127.0.0.2:8000", `{"priority":3,` + withHint[1:]},
		{"no hint: a client's own priority stays", []string{"--forward-priority"}, noHint, "", "127.0.0.2:8000", ""},
		{"off by default", nil, withHint, "", "127.0.0.2:8000", ""},
		{"engine from --engine-type", []string{"--forward-priority", "--engine-type=sglang"}, withHint, "", "127.0.0.2:8000", `{"priority":5,` + withHint[1:]},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, _, _ := newTestIntel(t, tc.args...)
			req := &extproc.Request{Body: []byte(tc.body), Headers: map[string]string{}, Subset: []string{tc.endpoint}, HasSubset: true}
			if tc.header != "" {
				req.Headers["x-laneway-priority"] = tc.header
			}
			d, err := h.Decide(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Lifecycle.Done()
			if d.Endpoints[0] != tc.endpoint {
				t.Fatalf("routed to %s, want %s", d.Endpoints[0], tc.endpoint)
			}
			if tc.want == "" {
				if d.Body != nil {
					t.Fatalf("body rewritten to %s, want unchanged", d.Body)
				}
				return
			}
			if string(d.Body) != tc.want {
				t.Fatalf("body\n got %s\nwant %s", d.Body, tc.want)
			}
		})
	}
}

func TestRoutedCountsCachedTokens(t *testing.T) {
	h, _, reg := newTestIntel(t)
	body := `{"model":"m","prompt":[` + strings.TrimSuffix(strings.Repeat("7,", 100), ",") + `]}`
	route := func() string {
		d, err := h.Decide(context.Background(), &extproc.Request{Body: []byte(body), Headers: map[string]string{}, Subset: []string{"127.0.0.2:8000"}, HasSubset: true})
		if err != nil {
			t.Fatal(err)
		}
		d.Lifecycle.Done()
		return d.Endpoints[0]
	}
	ep := route()
	route()
	// 100 tokens: the second request finds (100-1)/16 = 6 blocks cached.
	want := `
# HELP laneway_routed_cached_tokens_total Prompt tokens of the requests routed to an endpoint that the prefix index expected the endpoint to have cached (the cost snapshot's cached tokens).
# TYPE laneway_routed_cached_tokens_total counter
laneway_routed_cached_tokens_total{endpoint="` + ep + `"} 96
# HELP laneway_routed_prompt_tokens_total Prompt tokens of the requests routed to an endpoint.
# TYPE laneway_routed_prompt_tokens_total counter
laneway_routed_prompt_tokens_total{endpoint="` + ep + `"} 200
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "laneway_routed_cached_tokens_total", "laneway_routed_prompt_tokens_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount((*intelCollector)(h.Hooks.(*intel)), "laneway_endpoint_prefix_index_tokens"); n != 3 {
		t.Errorf("prefix index series %d, want one per endpoint (3)", n)
	}
}

func TestIntelOptions(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"defaults", nil, ""},
		{"least-loaded picker", []string{"--picker=least-loaded"}, ""},
		{"unknown picker", []string{"--picker=random"}, "--picker"},
		{"staleness below interval", []string{"--scrape-interval=1s", "--metrics-staleness=500ms"}, "--metrics-staleness"},
		{"zero interval", []string{"--scrape-interval=0s"}, "--scrape-interval"},
		{"block size", []string{"--prefix-block-size=0"}, "--prefix-block-size"},
		{"negative ttl", []string{"--prefix-cache-ttl=-1s"}, "--prefix-cache-ttl"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			fs := pflag.NewFlagSet("epp", pflag.ContinueOnError)
			o.AddFlags(fs)
			if err := fs.Parse(append([]string{"--endpoints=127.0.0.2:1"}, tc.args...)); err != nil {
				t.Fatal(err)
			}
			if err := o.Complete(); err != nil {
				t.Fatal(err)
			}
			err := o.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Validate = %v, want an error naming %s", err, tc.wantErr)
			}
		})
	}
	o := NewOptions()
	if !o.Intel.ScrapeMetrics || o.Intel.ScrapeInterval != 100*time.Millisecond || o.Intel.Picker != PickerPrefix || o.Intel.ForwardPriority {
		t.Errorf("defaults %+v: want scraping every 100ms, the prefix picker, no forwarding", o.Intel)
	}
}
