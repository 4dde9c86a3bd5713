package epp

import (
	"context"
	"fmt"
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
	"github.com/laneway-dev/laneway/pkg/sched"
	"github.com/laneway-dev/laneway/pkg/tokenize"
)

func TestParseBlocksHashesLikeTheSimulator(t *testing.T) {
	body := []byte(`{"model":"m","prompt":"` + strings.Repeat("the quick brown fox jumps over the lazy dog ", 40) + `","nvext":{"agent_hints":{"priority":3}}}`)
	toks, err := tokenize.ExtractPrompt(nil, body)
	if err != nil {
		t.Fatal(err)
	}
	var tk sched.Ticket
	if err := (BodyParser{}).ParseBlocks(&extproc.Request{Body: body}, &tk, 16, make([]uint64, 0, 4), &tokenize.Fields{}); err != nil {
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
	var plain sched.Ticket
	if err := (BodyParser{}).Parse(&extproc.Request{Body: body}, &plain); err != nil || plain.Blocks != nil || plain.RawISL != tk.RawISL {
		t.Errorf("Parse: %v, blocks %v, raw %d: want no hashes and the same count", err, plain.Blocks, plain.RawISL)
	}
}

// TestParseOutputTokens: the ticket's expected output is the osl hint,
// else max_completion_tokens or max_tokens, else unknown.
func TestParseOutputTokens(t *testing.T) {
	tests := []struct {
		body string
		want uint64
	}{
		{`{"prompt":"x"}`, 0},
		{`{"prompt":"x","max_tokens":300}`, 300},
		{`{"messages":[{"role":"user","content":"x"}],"max_completion_tokens":40,"max_tokens":300}`, 40},
		{`{"prompt":"x","max_tokens":300,"nvext":{"agent_hints":{"osl":120}}}`, 120},
		{`{"prompt":"x","max_tokens":"lots"}`, 0},
	}
	for _, tt := range tests {
		tk := sched.Ticket{OutputTokens: 99} // a recycled ticket: Parse must overwrite it
		if err := (BodyParser{}).Parse(&extproc.Request{Body: []byte(tt.body)}, &tk); err != nil {
			t.Fatalf("%s: %v", tt.body, err)
		}
		if tk.OutputTokens != tt.want {
			t.Errorf("%s: OutputTokens %d, want %d", tt.body, tk.OutputTokens, tt.want)
		}
	}
}

// countingTokenizer checks that the parser uses the configured Tokenizer.
type countingTokenizer struct{ n int }

func (c *countingTokenizer) Extract(dst []uint32, _ []byte, _ *tokenize.Fields) ([]uint32, error) {
	for i := range c.n {
		dst = append(dst, uint32(i))
	}
	return dst, nil
}

func TestBodyParserUsesItsTokenizer(t *testing.T) {
	var tk sched.Ticket
	p := BodyParser{Tokenizer: &countingTokenizer{n: 40}}
	if err := p.ParseBlocks(&extproc.Request{Body: []byte(`{"model":"m","prompt":"x"}`)}, &tk, 16, nil, &tokenize.Fields{}); err != nil {
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
	d, err := dispatcher.New(sched.FromCompiled(c), dopts)
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
	d.SetEndpoints([]sched.Endpoint{{Addr: "127.0.0.2:8000"}, {Addr: "127.0.0.3:8000", Engine: "sglang"}, {Addr: "127.0.0.4:8000", Engine: "trtllm"}})
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
		{"no hint: a client's own priority goes", []string{"--forward-priority"}, noHint, "", "127.0.0.2:8000", `{"model":"m","prompt":[1,2,3]}`},
		{"TRT-LLM: a client's own priority goes", []string{"--forward-priority"}, noHint, "", "127.0.0.4:8000", `{"model":"m","prompt":[1,2,3]}`},
		{"off: a client's own priority stays", nil, noHint, "", "127.0.0.2:8000", ""},
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

// bench32k returns a completions body whose prompt is about 32k tokens:
// text (the estimate) or token ids (exact).
func bench32k(ids bool) []byte {
	if ids {
		var sb strings.Builder
		sb.WriteString(`{"model":"m","prompt":[`)
		for i := range 32768 {
			if i > 0 {
				sb.WriteByte(',')
			}
			fmt.Fprint(&sb, 1+(i*7919)%49999)
		}
		sb.WriteString(`]}`)
		return []byte(sb.String())
	}
	return []byte(`{"model":"m","prompt":"` + strings.Repeat("The quick brown fox jumps over the lazy dog. ", 3277) + `"}`)
}

// BenchmarkParseBlocks32k: the request goroutine's share of a decision for
// a 32k-token prompt: tokenize (estimate or token ids), hash 2,048 blocks,
// read the hints; buffers pooled as the handler does.
func BenchmarkParseBlocks32k(b *testing.B) {
	for _, ids := range []bool{false, true} {
		name := "text"
		if ids {
			name = "token-ids"
		}
		b.Run(name, func(b *testing.B) {
			req := &extproc.Request{Body: bench32k(ids), Headers: map[string]string{}}
			b.SetBytes(int64(len(req.Body)))
			b.ReportAllocs()
			for b.Loop() {
				var tk sched.Ticket
				ps := parsedPool.Get().(*parsed)
				if err := (BodyParser{}).ParseBlocks(req, &tk, 16, ps.blocks[:0], &ps.fields); err != nil {
					b.Fatal(err)
				}
				if len(tk.Blocks) < 2000 {
					b.Fatalf("%d blocks", len(tk.Blocks))
				}
				recycleParsed(ps, &tk)
			}
		})
	}
}

// BenchmarkDecide32k100Endpoints: the handler's whole decision for a
// 32k-token text prompt over 100 endpoints — parse and hash, the loop's
// snapshot and pick (through its channel), the routed hooks — with the
// prompt cached on one endpoint.
func BenchmarkDecide32k100Endpoints(b *testing.B) {
	o := NewOptions()
	o.Intel.ScrapeMetrics = false
	o.MaxFallbacks = 2
	in := newIntel(o, logr.Discard())
	var dopts dispatcher.Options
	dopts.MaxFallbacks = 2
	in.configure(&dopts)
	c, err := (&policy.Config{}).Compile()
	if err != nil {
		b.Fatal(err)
	}
	d, err := dispatcher.New(sched.FromCompiled(c), dopts)
	if err != nil {
		b.Fatal(err)
	}
	if err := in.attach(d, prometheus.NewRegistry()); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	var eps []sched.Endpoint
	for i := range 100 {
		eps = append(eps, sched.Endpoint{Addr: fmt.Sprintf("10.0.0.%d:8000", i+1)})
	}
	d.SetEndpoints(eps)
	h := &Handler{Parser: BodyParser{}, Dispatcher: d, Hooks: in}
	req := &extproc.Request{Body: bench32k(false), Headers: map[string]string{}}
	b.ReportAllocs()
	for b.Loop() {
		dec, err := h.Decide(context.Background(), req)
		if err != nil {
			b.Fatal(err)
		}
		dec.Lifecycle.Done()
	}
}

// TestParseKeysAreCaseSensitive: the picker reads model and nvext with the
// rule the prompt has always had, and the OpenAI API and vLLM have: JSON
// keys are case-sensitive. "Model" and "NVEXT" are fields the engine
// ignores, so the picker must ignore them too.
func TestParseKeysAreCaseSensitive(t *testing.T) {
	body := []byte(`{"model":"a","Model":"b","prompt":"x","NVEXT":{"agent_hints":{"priority":9}},"nvext":{"Agent_Hints":{"priority":8}}}`)
	var tk sched.Ticket
	if err := (BodyParser{}).Parse(&extproc.Request{Body: body}, &tk); err != nil {
		t.Fatal(err)
	}
	if tk.Model != "a" || tk.HasPriority || tk.Priority != 0 {
		t.Errorf("model %q priority %d (has %v); want model a and no priority hint", tk.Model, tk.Priority, tk.HasPriority)
	}
}

// TestBodylessRequestDecidedOnHeaders: a request without a body (GET
// /v1/models, the audit's probe) is decided on its headers (SPEC §7), not
// refused 400 "request body is empty"; its header hints count, and with
// --forward-priority there is no body to rewrite.
func TestBodylessRequestDecidedOnHeaders(t *testing.T) {
	for _, args := range [][]string{nil, {"--forward-priority"}} {
		t.Run(strings.Join(append([]string{"flags"}, args...), " "), func(t *testing.T) {
			h, _, _ := newTestIntel(t, args...)
			req := &extproc.Request{Headers: map[string]string{":method": "GET", ":path": "/v1/models", "x-laneway-priority": "3"},
				Subset: []string{"127.0.0.2:8000"}, HasSubset: true}
			d, err := h.Decide(context.Background(), req)
			if err != nil {
				t.Fatalf("answered %v, want routed", err)
			}
			defer d.Lifecycle.Done()
			if d.Endpoints[0] != "127.0.0.2:8000" || d.Body != nil {
				t.Fatalf("routed to %v with body %q, want 127.0.0.2:8000 and no body", d.Endpoints, d.Body)
			}
		})
	}
	var tk sched.Ticket
	if err := (BodyParser{}).Parse(&extproc.Request{Headers: map[string]string{"x-laneway-priority": "3", "x-laneway-policy-class": "gold"}}, &tk); err != nil {
		t.Fatalf("Parse without a body: %v", err)
	}
	if tk.Model != "" || tk.RawISL != 0 || !tk.HasPriority || tk.Priority != 3 || tk.ClassHeader != "gold" {
		t.Errorf("ticket %+v, want no model, 0 tokens, priority 3 and class gold from the headers", tk)
	}
}
