package epp

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
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

func TestReadBodyFields(t *testing.T) {
	cases := []struct {
		name, body string
		model      string
		priority   int32
		wantErr    string
	}{
		{"plain", `{"model":"m","prompt":"x","nvext":{"agent_hints":{"priority":4}}}`, "m", 4, ""},
		{"keys fold like encoding/json, last wins", `{"Model":"a","MODEL":"b","NVEXT":{"agent_hints":{"priority":2}}}`, "b", 2, ""},
		{"escaped key", `{"mod\u0065l":"e"}`, "e", 0, ""},
		{"null nvext", `{"model":"m","nvext":null}`, "m", 0, ""},
		{"model not a string", `{"model":7}`, "", 0, "field model: number does not fit string"},
		{"priority out of range", `{"nvext":{"agent_hints":{"priority":3000000000}}}`, "", 0, "field nvext.agent_hints.priority: number 3000000000 does not fit int32"},
		{"not an object", `[1]`, "", 0, "not a JSON object"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := readBodyFields([]byte(tc.body))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var p int32
			if f.NVExt != nil && f.NVExt.AgentHints != nil && f.NVExt.AgentHints.Priority != nil {
				p = *f.NVExt.AgentHints.Priority
			}
			if f.Model != tc.model || p != tc.priority {
				t.Fatalf("model %q priority %d, want %q %d", f.Model, p, tc.model, tc.priority)
			}
		})
	}
}

// TestReadBodyFieldsAgreesWithEncodingJSON: the scanner and its plain
// string shortcut decode model and nvext exactly as encoding/json decodes
// the whole body.
func TestReadBodyFieldsAgreesWithEncodingJSON(t *testing.T) {
	bodies := []struct{ name, body string }{
		{"plain model", `{"model":"llama-3.1-8b","prompt":[1,2,3]}`},
		{"empty model", `{"model":""}`},
		{"unicode model", `{"model":"modèle-日本"}`},
		{"escaped model", `{"model":"a\"b\u00e9\n"}`},
		{"invalid UTF-8 in model", "{\"model\":\"a\xffb\"}"},
		{"null after a value keeps the value", `{"model":"first","model":null}`},
		{"null model", `{"model":null}`},
		{"case-folded keys, last wins", `{"MODEL":"a","Model":"b","mOdEl":"c"}`},
		{"Kelvin sign folds to k", "{\"model\":\"m\",\"nve\u212At\":{\"agent_hints\":{\"priority\":3}}}"},
		{"escaped keys", `{"mod\u0065l":"e","nv\u0065xt":{"agent_hints":{"priority":-1}}}`},
		{"nvext merged across duplicates", `{"nvext":{"agent_hints":{"priority":1}},"nvext":{"agent_hints":{}}}`},
		{"whitespace everywhere", " { \"model\" : \"m\" , \"nvext\" : { } } "},
	}
	for _, tc := range bodies {
		t.Run(tc.name, func(t *testing.T) {
			var want bodyFields
			if err := json.Unmarshal([]byte(tc.body), &want); err != nil {
				t.Fatalf("the oracle rejects the body: %v", err)
			}
			got, err := readBodyFields([]byte(tc.body))
			if err != nil {
				t.Fatalf("readBodyFields: %v", err)
			}
			if got.Model != want.Model || !reflect.DeepEqual(got.NVExt, want.NVExt) {
				t.Errorf("got model %q nvext %+v, encoding/json decodes model %q nvext %+v", got.Model, got.NVExt, want.Model, want.NVExt)
			}
		})
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
				var tk dispatcher.Ticket
				buf := blockBufs.Get().(*[]uint64)
				if err := (BodyParser{}).ParseBlocks(req, &tk, 16, (*buf)[:0]); err != nil {
					b.Fatal(err)
				}
				if len(tk.Blocks) < 2000 {
					b.Fatalf("%d blocks", len(tk.Blocks))
				}
				recycleBlocks(buf, &tk)
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
	d, err := dispatcher.New(dispatcher.FromCompiled(c), dopts)
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
	var eps []dispatcher.Endpoint
	for i := range 100 {
		eps = append(eps, dispatcher.Endpoint{Addr: fmt.Sprintf("10.0.0.%d:8000", i+1)})
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

// BenchmarkReadBodyFields: the scan for model and nvext over a body the
// tokenizer has already read, for the load test's 256-token id prompt and
// a 32k-token text prompt.
func BenchmarkReadBodyFields(b *testing.B) {
	ids := make([]int, 256)
	for i := range ids {
		ids[i] = 1 + (i*7919)%50000
	}
	body256, err := json.Marshal(map[string]any{"model": "loadgen", "prompt": ids, "max_tokens": 1, "stream": true})
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		body []byte
	}{{"ids256", body256}, {"text32k", bench32k(false)}, {"ids32k", bench32k(true)}} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(bc.body)))
			b.ReportAllocs()
			for b.Loop() {
				if f, err := readBodyFields(bc.body); err != nil || f.Model == "" {
					b.Fatalf("model %q, err %v", f.Model, err)
				}
			}
		})
	}
}
