package simulate

import (
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/pkg/tokenize"
)

func TestReadJSONL(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []Request
		err  string
	}{
		{
			name: "every field",
			in:   `{"arrival_ms": 1.5, "class": "premium", "tenant": "a", "prompt_tokens": 512, "output_tokens": 3, "prefix_group": "sys", "prefix_tokens": 256, "priority": -2, "strict_priority": 1}`,
			want: []Request{{Arrival: 1500000, Class: "premium", Tenant: "a", PromptTokens: 512, OutputTokens: 3,
				PrefixGroup: "sys", PrefixTokens: 256, Priority: -2, HasPriority: true, Strict: 1}},
		},
		{
			name: "the issue's line",
			in:   `{"arrival_ms": 0, "class": "premium", "tenant": "a", "prompt_tokens": 512, "output_tokens": 1, "prefix_group": "", "priority": 0, "strict_priority": 0}`,
			want: []Request{{Class: "premium", Tenant: "a", PromptTokens: 512, OutputTokens: 1, HasPriority: true}},
		},
		{
			name: "defaults and blank lines",
			in:   "\n{\"arrival_ms\": 0, \"prompt_tokens\": 7}\n\n",
			want: []Request{{PromptTokens: 7, OutputTokens: DefaultOutputTokens}},
		},
		{name: "no arrival", in: `{"prompt_tokens": 7}`, err: "line 1: arrival_ms is required"},
		{name: "no prompt", in: `{"arrival_ms": 0}`, err: "prompt_tokens (or prompt) is required"},
		{name: "unknown field", in: `{"arrival_ms": 0, "prompt_tokens": 1, "colour": 1}`, err: `unknown field "colour"`},
		{name: "negative arrival", in: `{"arrival_ms": -1, "prompt_tokens": 1}`, err: "arrival_ms -1"},
		{name: "zero output", in: `{"arrival_ms": 0, "prompt_tokens": 1, "output_tokens": 0}`, err: "output_tokens 0"},
		{name: "prefix tokens without group", in: `{"arrival_ms": 0, "prompt_tokens": 9, "prefix_tokens": 4}`, err: "prefix_tokens 4"},
		{name: "second line bad", in: "{\"arrival_ms\": 0, \"prompt_tokens\": 1}\n{\"arrival_ms\": 0,", err: "line 2"},
		{name: "empty", in: "", err: "no requests"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, err := ReadJSONL(strings.NewReader(tt.in), "t.jsonl")
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(tr.Requests, tt.want, sameRequest) {
				t.Fatalf("got %+v\nwant %+v", tr.Requests, tt.want)
			}
		})
	}
}

// TestJSONLTextPrompt: a text prompt is tokenized, and two prompts that
// start with the same text share their leading block hashes.
func TestJSONLTextPrompt(t *testing.T) {
	long := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 20)
	tr, err := ReadJSONL(strings.NewReader(
		`{"arrival_ms": 0, "prompt": "`+long+strings.Repeat("first question ", 20)+`"}`+"\n"+
			`{"arrival_ms": 1, "prompt": "`+long+strings.Repeat("second one ", 20)+`"}`), "t")
	if err != nil {
		t.Fatal(err)
	}
	a, b := tr.Requests[0], tr.Requests[1]
	if a.PromptTokens < 100 || !tr.cacheable {
		t.Fatalf("prompt tokens %d, cacheable %t", a.PromptTokens, tr.cacheable)
	}
	ha, hb := a.appendHashes(nil, 16, 0), b.appendHashes(nil, 16, 1)
	common := 0
	for common < min(len(ha), len(hb)) && ha[common] == hb[common] {
		common++
	}
	shared := len(tokenizeText(long)) / 16
	if common != shared || len(ha) <= shared+1 {
		t.Fatalf("%d of %d blocks shared, want the %d blocks of the common text", common, len(ha), shared)
	}
}

func TestPromptHashes(t *testing.T) {
	g := func(group string, prompt, prefix int, own uint64) []uint64 {
		r := Request{PromptTokens: prompt, PrefixGroup: group, PrefixTokens: prefix}
		return r.appendHashes(nil, 16, own)
	}
	shared := func(a, b []uint64) int {
		n := 0
		for n < min(len(a), len(b)) && a[n] == b[n] {
			n++
		}
		return n
	}
	for _, tt := range []struct {
		name string
		a, b []uint64
		want int
	}{
		{"same group, whole prompt, different lengths", g("x", 1000, 0, 1), g("x", 2000, 0, 2), 62},
		{"same group, 500 shared tokens", g("x", 1000, 500, 1), g("x", 1000, 500, 2), 31},
		{"different groups", g("x", 1000, 0, 1), g("y", 1000, 0, 2), 0},
		{"no group", g("", 1000, 0, 1), g("", 1000, 0, 2), 0},
		{"no group, same request", g("", 1000, 0, 1), g("", 1000, 0, 1), 62},
	} {
		if got := shared(tt.a, tt.b); got != tt.want {
			t.Errorf("%s: %d blocks shared, want %d", tt.name, got, tt.want)
		}
	}
}

func TestReadAzureCSV(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []Request
		err  string
	}{
		{
			name: "datetime, as the public files",
			in: "TIMESTAMP,ContextTokens,GeneratedTokens\n" +
				"2023-11-16 18:15:46.6805900,374,44\n" +
				"2023-11-16 18:15:50.9951690,396,109\n" +
				"2023-11-16 18:15:45.5000000,879,0\n",
			want: []Request{
				{Arrival: 1180590000, PromptTokens: 374, OutputTokens: 44},
				{Arrival: 5495169000, PromptTokens: 396, OutputTokens: 109},
				{Arrival: 0, PromptTokens: 879, OutputTokens: 1},
			},
		},
		{
			name: "seconds, other column order and extra columns",
			in:   "GeneratedTokens,Extra,ContextTokens,timestamp\n10,x,100,12.5\n20,y,200,13\n",
			want: []Request{{PromptTokens: 100, OutputTokens: 10}, {Arrival: 500000000, PromptTokens: 200, OutputTokens: 20}},
		},
		{name: "missing column", in: "TIMESTAMP,ContextTokens\n1,2\n", err: "generatedtokens"},
		{name: "bad time", in: "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n", err: `row 2: timestamp "yesterday"`},
		{name: "bad count", in: "TIMESTAMP,ContextTokens,GeneratedTokens\n0,-3,1\n", err: "contexttokens"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, err := ReadAzureCSV(strings.NewReader(tt.in), "azure.csv")
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(tr.Requests, tt.want, sameRequest) {
				t.Fatalf("got %+v\nwant %+v", tr.Requests, tt.want)
			}
			if tt.name == "datetime, as the public files" && !slices.Equal(tr.byArrival, []int32{2, 0, 1}) {
				t.Fatalf("arrival order %v", tr.byArrival)
			}
		})
	}
}

func TestRules(t *testing.T) {
	tr := &Trace{Source: "t"}
	for _, n := range []int{10, 100, 1000, 2047, 2048, 9000} {
		tr.Requests = append(tr.Requests, Request{PromptTokens: n, OutputTokens: 1})
	}
	tr.Requests[0].Class, tr.Requests[0].Tenant = "given", "given"
	length, err := ParseRule("length:small<100,mid<2048,large")
	if err != nil {
		t.Fatal(err)
	}
	uni, err := ParseRule("uniform:3/team")
	if err != nil {
		t.Fatal(err)
	}
	tr.Assign(length, uni, 1)
	var classes []string
	for _, r := range tr.Requests {
		classes = append(classes, r.Class)
		if r.Tenant != "given" && r.Tenant != "team-1" && r.Tenant != "team-2" && r.Tenant != "team-3" {
			t.Errorf("tenant %q", r.Tenant)
		}
	}
	if want := []string{"given", "mid", "mid", "mid", "large", "large"}; !slices.Equal(classes, want) {
		t.Fatalf("classes %v, want %v", classes, want)
	}

	split, err := ParseRule("split:a=1,b=3")
	if err != nil {
		t.Fatal(err)
	}
	big := &Trace{Source: "t", Requests: make([]Request, 40000)}
	big.Assign(split, nil, 7)
	n := 0
	for _, r := range big.Requests {
		if r.Class == "a" {
			n++
		}
	}
	if math.Abs(float64(n)/40000-0.25) > 0.01 {
		t.Fatalf("split a=1,b=3 gave a to %d of 40000", n)
	}
	for _, bad := range []string{"", "length:", "length:a", "length:a<10,b<5,c", "length:a<x,b", "split:a=0", "split:a", "uniform:0", "uniform:x", "magic:1", "length:a b<3,c"} {
		if _, err := ParseRule(bad); err == nil {
			t.Errorf("ParseRule(%q) accepted", bad)
		}
	}
}

func TestGenerate(t *testing.T) {
	t.Run("weighted share interleaves", func(t *testing.T) {
		tr, err := Generate(weightedShareSpec, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(tr.Requests) != 640 {
			t.Fatalf("%d requests", len(tr.Requests))
		}
		for i, r := range tr.Requests {
			want := "premium"
			if i%2 == 1 {
				want = "regular"
			}
			if r.Class != want || r.Arrival != 0 || r.PromptTokens != 512 || r.OutputTokens != 1 {
				t.Fatalf("request %d: %+v", i, r)
			}
		}
	})
	t.Run("poisson rate and determinism", func(t *testing.T) {
		spec := "class=a,rate=50,prompt=100-200,output=~20,duration=100s;class=b,arrival=uniform,rate=2,prompt=3000,duration=100s"
		a, err := Generate(spec, 9)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := Generate(spec, 9)
		c, _ := Generate(spec, 10)
		if !slices.EqualFunc(a.Requests, b.Requests, sameRequest) {
			t.Fatal("the same seed gave two traces")
		}
		if slices.EqualFunc(a.Requests, c.Requests, sameRequest) {
			t.Fatal("two seeds gave one trace")
		}
		var na, nb, out int
		for _, r := range a.Requests {
			switch r.Class {
			case "a":
				na++
				out += r.OutputTokens
				if r.PromptTokens < 100 || r.PromptTokens > 200 {
					t.Fatalf("prompt %d outside 100-200", r.PromptTokens)
				}
			case "b":
				nb++
			}
		}
		if math.Abs(float64(na)-5000) > 300 || nb != 200 {
			t.Fatalf("a %d (want about 5000), b %d (want 200)", na, nb)
		}
		if mean := float64(out) / float64(na); math.Abs(mean-20) > 1.5 {
			t.Fatalf("mean output %.1f, want about 20", mean)
		}
	})
	t.Run("bursty is silent off", func(t *testing.T) {
		tr, err := Generate("arrival=bursty,on=2s,off=3s,rate=100,prompt=10,duration=50s", 3)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range tr.Requests {
			if phase := time.Duration(r.Arrival) % (5 * time.Second); phase >= 2*time.Second {
				t.Fatalf("arrival at %v is in an off period", time.Duration(r.Arrival))
			}
		}
		if n := len(tr.Requests); n < 1800 || n > 2200 {
			t.Fatalf("%d requests, want about 10 on periods × 2 s × 100/s", n)
		}
	})
	t.Run("tenants, prefixes, hints, count and start", func(t *testing.T) {
		tr, err := Generate("tenant=org,tenants=3,rate=10,count=30,start=5s,prompt=600,prefix=512,groups=2,priority=4,strict=1", 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(tr.Requests) != 30 {
			t.Fatalf("%d requests", len(tr.Requests))
		}
		for _, r := range tr.Requests {
			if !strings.HasPrefix(r.Tenant, "org-") || !strings.HasPrefix(r.PrefixGroup, "s1-g") || r.PrefixTokens != 512 ||
				r.Priority != 4 || !r.HasPriority || r.Strict != 1 || r.Arrival < int64(5*time.Second) {
				t.Fatalf("request %+v", r)
			}
		}
	})
	for _, bad := range []string{"", "rate=1,duration=1s", "prompt=10", "prompt=10,rate=1", "prompt=10,arrival=once",
		"prompt=10,arrival=bursty,rate=1,duration=1s", "prompt=0,arrival=once,count=1", "prompt=5-2,arrival=once,count=1",
		"prompt=10,arrival=once,count=1,colour=red", "prompt=10,prompt=11,arrival=once,count=1", "prompt=~0,arrival=once,count=1",
		"prompt=10,arrival=sometimes,count=1", "prompt=10,rate=-1,count=1"} {
		if _, err := Generate(bad, 1); err == nil {
			t.Errorf("Generate(%q) accepted", bad)
		}
	}
}

// sameRequest compares requests without their token ids.
func sameRequest(a, b Request) bool {
	a.tokens, b.tokens = nil, nil
	return reflect.DeepEqual(a, b)
}

func tokenizeText(s string) []uint32 { return tokenize.Tokenize(nil, s) }
