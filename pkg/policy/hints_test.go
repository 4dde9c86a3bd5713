package policy

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/laneway-dev/laneway/pkg/tokenize"
)

// TestApplyAgentHints: the body's hints (read by tokenize.Extract, whose
// own tests cover the JSON) set what they carry and leave the rest.
func TestApplyAgentHints(t *testing.T) {
	start := Hints{Priority: 1, HasPriority: true, StrictPriority: 2, OSL: 3, HasOSL: true, SpeculativePrefill: true, Class: "c"}
	tests := []struct {
		name string
		body string
		want Hints
	}{
		{"no nvext keeps all", `{"model":"m"}`, start},
		{"all hints", `{"nvext":{"agent_hints":{"priority":10,"strict_priority":4,"osl":128,"speculative_prefill":false}}}`,
			Hints{Priority: 10, HasPriority: true, StrictPriority: 4, OSL: 128, HasOSL: true, Class: "c"}},
		{"negative priority kept raw", `{"nvext":{"agent_hints":{"priority":-7}}}`,
			Hints{Priority: -7, HasPriority: true, StrictPriority: 2, OSL: 3, HasOSL: true, SpeculativePrefill: true, Class: "c"}},
		{"deprecated alias", `{"nvext":{"agent_hints":{"latency_sensitivity":3}}}`,
			Hints{Priority: 3, HasPriority: true, StrictPriority: 2, OSL: 3, HasOSL: true, SpeculativePrefill: true, Class: "c"}},
		{"int32 and uint32 bounds", `{"nvext":{"agent_hints":{"priority":-2147483648,"strict_priority":4294967295}}}`,
			Hints{Priority: math.MinInt32, HasPriority: true, StrictPriority: math.MaxUint32, OSL: 3, HasOSL: true, SpeculativePrefill: true, Class: "c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var f tokenize.Fields
			if _, err := tokenize.Extract(nil, []byte(tt.body), &f); err != nil && !errors.Is(err, tokenize.ErrNoPrompt) {
				t.Fatal(err)
			}
			got := start
			got.ApplyAgentHints(f.Hints)
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestHeaderHints(t *testing.T) {
	body := Hints{Priority: 1, HasPriority: true, StrictPriority: 1}
	tests := []struct {
		name    string
		headers [][2]string
		want    Hints
	}{
		{"no headers keep the body", nil, body},
		{"dynamo headers override the body", [][2]string{
			{"x-dynamo-request-priority", "9"}, {"x-dynamo-request-strict-priority", "3"}, {"x-dynamo-meta-policy-class", "premium"},
		}, Hints{Priority: 9, HasPriority: true, StrictPriority: 3, Class: "premium"}},
		{"laneway headers", [][2]string{
			{"x-laneway-priority", "-4"}, {"x-laneway-strict-priority", "2"}, {"x-laneway-policy-class", "gold"},
		}, Hints{Priority: -4, HasPriority: true, StrictPriority: 2, Class: "gold"}},
		{"laneway names win over dynamo names", [][2]string{
			{"x-dynamo-request-priority", "9"}, {"x-laneway-priority", "5"},
			{"x-laneway-policy-class", "gold"}, {"x-dynamo-meta-policy-class", "premium"},
		}, Hints{Priority: 5, HasPriority: true, StrictPriority: 1, Class: "gold"}},
		{"malformed laneway header falls back to dynamo", [][2]string{
			{"x-laneway-priority", "high"}, {"x-dynamo-request-priority", "7"},
		}, Hints{Priority: 7, HasPriority: true, StrictPriority: 1}},
		{"malformed headers are ignored", [][2]string{
			{"x-dynamo-request-priority", "1.5"}, {"x-dynamo-request-strict-priority", "-1"},
			{"x-laneway-strict-priority", "4294967296"},
		}, body},
		{"out of int32 range is malformed", [][2]string{{"x-dynamo-request-priority", "2147483648"}}, body},
		{"trimmed, names case-insensitive", [][2]string{
			{"X-Dynamo-Meta-Policy-Class", "  premium \t"}, {"X-DYNAMO-REQUEST-PRIORITY", " 3 "},
		}, Hints{Priority: 3, HasPriority: true, StrictPriority: 1, Class: "premium"}},
		{"empty is absent, later value counts", [][2]string{
			{"x-dynamo-meta-policy-class", "   "}, {"x-dynamo-meta-policy-class", "regular"},
		}, Hints{Priority: 1, HasPriority: true, StrictPriority: 1, Class: "regular"}},
		{"first value wins", [][2]string{
			{"x-dynamo-meta-policy-class", "premium"}, {"x-dynamo-meta-policy-class", "regular"},
			{"x-dynamo-request-priority", "2"}, {"x-dynamo-request-priority", "8"},
		}, Hints{Priority: 2, HasPriority: true, StrictPriority: 1, Class: "premium"}},
		{"folded values: first wins", [][2]string{{"x-dynamo-meta-policy-class", "premium, regular"}, {"x-laneway-priority", "6,7"}},
			Hints{Priority: 6, HasPriority: true, StrictPriority: 1, Class: "premium"}},
		{"malformed first value is not replaced", [][2]string{
			{"x-dynamo-request-priority", "x"}, {"x-dynamo-request-priority", "8"},
		}, body},
		{"other headers ignored", [][2]string{{"content-type", "application/json"}, {"x-request-id", "abc"}, {"x-dynamo-request-priorityy", "5"}}, body},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var hh HeaderHints
			for _, h := range tt.headers {
				hh.Observe(h[0], h[1])
			}
			got := body
			hh.Apply(&got)
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestHeaderHintsObserveReportsHintHeaders(t *testing.T) {
	var hh HeaderHints
	for _, name := range []string{HeaderDynamoPriority, HeaderDynamoStrictPriority, HeaderDynamoPolicyClass, HeaderPriority, HeaderStrictPriority, HeaderPolicyClass} {
		if !hh.Observe(name, "1") {
			t.Errorf("Observe(%q) = false, want true", name)
		}
	}
	for _, name := range []string{"", "x", "content-type", "x-laneway-priority-x", ":path"} {
		if hh.Observe(name, "1") {
			t.Errorf("Observe(%q) = true, want false", name)
		}
	}
}

func TestHeaderHintsDoNotAllocate(t *testing.T) {
	allocs := testing.AllocsPerRun(1000, func() {
		var hh HeaderHints
		hh.Observe("content-type", "application/json")
		hh.Observe("x-dynamo-request-priority", " 5 ")
		hh.Observe("x-laneway-policy-class", "gold")
		var h Hints
		hh.Apply(&h)
	})
	if allocs != 0 {
		t.Errorf("header hints allocate %.1f times, want 0", allocs)
	}
}

func TestForwardPriority(t *testing.T) {
	tests := []struct {
		engine Engine
		p      int32
		want   int64
		ok     bool
	}{
		{EngineVLLM, 10, -10, true},
		{EngineVLLM, -3, 3, true},
		{EngineVLLM, math.MinInt32, -math.MinInt32, true},
		{EngineSGLang, 10, 10, true},
		{EngineSGLang, -3, -3, true},
		{EngineTRTLLM, 10, 0, false},
		{Engine(99), 10, 0, false},
	}
	for _, tt := range tests {
		got, ok := ForwardPriority(tt.engine, tt.p)
		if got != tt.want || ok != tt.ok {
			t.Errorf("ForwardPriority(%v, %d) = %d, %v; want %d, %v", tt.engine, tt.p, got, ok, tt.want, tt.ok)
		}
	}
}

func TestParseEngine(t *testing.T) {
	for in, want := range map[string]Engine{"vllm": EngineVLLM, "SGLang": EngineSGLang, " trtllm ": EngineTRTLLM, "tensorrt-llm": EngineTRTLLM} {
		got, err := ParseEngine(in)
		if err != nil || got != want {
			t.Errorf("ParseEngine(%q) = %v, %v; want %v", in, got, err, want)
		}
		if got.String() != strings.TrimSpace(strings.ToLower(in)) && in != "tensorrt-llm" {
			t.Errorf("%v.String() = %q", got, got.String())
		}
	}
	if _, err := ParseEngine("tgi"); err == nil || !strings.Contains(err.Error(), `"tgi"`) {
		t.Errorf("ParseEngine(tgi) error = %v, want one naming the input", err)
	}
	if got := Engine(9).String(); got != "Engine(9)" {
		t.Errorf("String of unknown engine = %q", got)
	}
}
