package tokenize

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// refFields is the oracle for Extract's fields, built on encoding/json: it
// walks the top-level members in order (duplicates included) with exact
// keys, and leaves each value's meaning to encoding/json by decoding it
// into the pointer field the old body struct had (so null clears, a nested
// object merges into what an earlier duplicate set, and range and type
// errors are encoding/json's).
func refFields(body []byte) (Fields, error) {
	var f Fields
	var h struct {
		priority, latency *int32
		strict, osl       *uint32
		spec              *bool
	}
	var maxTokens, maxCompletion *uint32
	count := func(raw json.RawMessage) *uint32 {
		if len(raw) == 0 || raw[0] < '0' || raw[0] > '9' {
			return nil // a sign, a string, null: absent
		}
		v, err := strconv.ParseUint(string(raw), 10, 32)
		if err != nil {
			return nil // a fraction, an exponent, out of range: absent
		}
		u := uint32(v)
		return &u
	}
	err := members(body, func(key string, keyAt int, raw json.RawMessage, start, end int) error {
		switch key {
		case "max_tokens":
			maxTokens = count(raw)
		case "max_completion_tokens":
			maxCompletion = count(raw)
		case "model":
			return json.Unmarshal(raw, &f.Model)
		case "priority":
			f.Priority.Values = append(f.Priority.Values, Span{start, end})
			f.Priority.Keys = append(f.Priority.Keys, keyAt)
		case "nvext":
			if string(raw) == "null" {
				h.priority, h.latency, h.strict, h.osl, h.spec = nil, nil, nil, nil, nil
				return nil
			}
			return members(raw, func(key string, _ int, raw json.RawMessage, _, _ int) error {
				if key != "agent_hints" {
					return nil
				}
				if string(raw) == "null" {
					h.priority, h.latency, h.strict, h.osl, h.spec = nil, nil, nil, nil, nil
					return nil
				}
				return members(raw, func(key string, _ int, raw json.RawMessage, _, _ int) error {
					switch key {
					case "priority":
						return json.Unmarshal(raw, &h.priority)
					case "latency_sensitivity":
						return json.Unmarshal(raw, &h.latency)
					case "strict_priority":
						return json.Unmarshal(raw, &h.strict)
					case "osl":
						return json.Unmarshal(raw, &h.osl)
					case "speculative_prefill":
						return json.Unmarshal(raw, &h.spec)
					}
					return nil
				})
			})
		}
		return nil
	})
	if err != nil {
		return Fields{}, err
	}
	switch {
	case h.priority != nil:
		f.Hints.Priority, f.Hints.HasPriority = *h.priority, true
	case h.latency != nil:
		f.Hints.Priority, f.Hints.HasPriority = *h.latency, true
	}
	if h.strict != nil {
		f.Hints.StrictPriority, f.Hints.HasStrictPriority = *h.strict, true
	}
	if h.osl != nil {
		f.Hints.OSL, f.Hints.HasOSL = *h.osl, true
	}
	if h.spec != nil {
		f.Hints.SpeculativePrefill, f.Hints.HasSpeculativePrefill = *h.spec, true
	}
	switch {
	case maxCompletion != nil:
		f.MaxTokens, f.HasMaxTokens = *maxCompletion, true
	case maxTokens != nil:
		f.MaxTokens, f.HasMaxTokens = *maxTokens, true
	}
	open := bytes.IndexByte(body, '{')
	f.Priority.Open = open
	f.Priority.Empty = len(bytes.TrimSpace(body[open+1:])) == 1
	return f, nil
}

// members calls fn with each member of the JSON object obj in order: its
// decoded key, the offset of the key's opening quote, its raw value and
// the value's byte range in obj. A value that is not an object is an
// error, as decoding it into a struct is.
func members(obj []byte, fn func(key string, keyAt int, raw json.RawMessage, start, end int) error) error {
	dec := json.NewDecoder(bytes.NewReader(obj))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return errors.New("not an object")
	}
	for dec.More() {
		// The key starts at the first quote after the previous token.
		keyAt := int(dec.InputOffset())
		for keyAt < len(obj) && obj[keyAt] != '"' {
			keyAt++
		}
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return err
		}
		end := int(dec.InputOffset())
		if err := fn(tok.(string), keyAt, raw, end-len(raw), end); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the object")
	}
	return nil
}

// sameFields compares Fields, treating nil and empty Values alike.
func sameFields(a, b Fields) bool {
	return a.Model == b.Model && a.Hints == b.Hints && a.MaxTokens == b.MaxTokens && a.HasMaxTokens == b.HasMaxTokens &&
		a.Priority.Open == b.Priority.Open &&
		a.Priority.Empty == b.Priority.Empty && slices.Equal(a.Priority.Values, b.Priority.Values) &&
		slices.Equal(a.Priority.Keys, b.Priority.Keys)
}

// extractFields runs Extract for its fields; a body without a prompt is
// fine here (the fields are complete after ErrNoPrompt).
func extractFields(body string) (Fields, error) {
	var f Fields
	_, err := Extract(nil, []byte(body), &f)
	if errors.Is(err, ErrNoPrompt) {
		err = nil
	}
	return f, err
}

func TestExtractFields(t *testing.T) {
	p := func(v int32) AgentHints { return AgentHints{Priority: v, HasPriority: true} }
	tests := []struct {
		name    string
		body    string
		model   string
		hints   AgentHints
		wantErr string // substring of the error; "" = none
	}{
		{name: "plain", body: `{"model":"m","prompt":"x","nvext":{"agent_hints":{"priority":4}}}`, model: "m", hints: p(4)},
		{name: "no nvext", body: `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, model: "m"},
		{name: "all hints", body: `{"model":"m","nvext":{"agent_hints":{"priority":10,"strict_priority":2,"osl":128,"speculative_prefill":true}},"max_tokens":1}`,
			model: "m", hints: AgentHints{Priority: 10, HasPriority: true, StrictPriority: 2, HasStrictPriority: true, OSL: 128, HasOSL: true, SpeculativePrefill: true, HasSpeculativePrefill: true}},
		{name: "negative priority kept raw", body: `{"nvext":{"agent_hints":{"priority":-7}}}`, hints: p(-7)},
		{name: "deprecated alias", body: `{"nvext":{"agent_hints":{"latency_sensitivity":3}}}`, hints: p(3)},
		{name: "priority wins over the alias", body: `{"nvext":{"agent_hints":{"latency_sensitivity":3,"priority":5}}}`, hints: p(5)},
		{name: "nulls are absent", body: `{"nvext":{"agent_hints":{"priority":null,"osl":null}}}`},
		{name: "null agent_hints", body: `{"nvext":{"agent_hints":null}}`},
		{name: "null nvext", body: `{"model":"m","nvext":null}`, model: "m"},
		{name: "null nvext drops an earlier one", body: `{"nvext":{"agent_hints":{"priority":1}},"nvext":null}`},
		{name: "nvext merged across duplicates", body: `{"nvext":{"agent_hints":{"priority":1}},"nvext":{"agent_hints":{}}}`, hints: p(1)},
		{name: "other nvext fields ignored", body: `{"nvext":{"ignore_eos":true,"agent_hints":{"priority":1}}}`, hints: p(1)},
		{name: "int32 and uint32 bounds", body: `{"nvext":{"agent_hints":{"priority":-2147483648,"strict_priority":4294967295}}}`,
			hints: AgentHints{Priority: math.MinInt32, HasPriority: true, StrictPriority: math.MaxUint32, HasStrictPriority: true}},
		{name: "escaped keys", body: `{"mod\u0065l":"e","nv\u0065xt":{"agent_hints":{"priority":-1}}}`, model: "e", hints: p(-1)},
		{name: "null model keeps an earlier one", body: `{"model":"first","model":null}`, model: "first"},
		{name: "last model wins", body: `{"model":"a","model":"b"}`, model: "b"},
		{name: "escaped model", body: `{"model":"a\"b\u00e9\n"}`, model: "a\"bé\n"},
		{name: "invalid UTF-8 in model", body: "{\"model\":\"a\xffb\"}", model: "a\uFFFDb"},
		{name: "whitespace everywhere", body: " { \"model\" : \"m\" , \"nvext\" : { } } ", model: "m"},
		// One key-matching rule: JSON keys are case-sensitive, as the
		// OpenAI API and vLLM read them (this replaces the earlier
		// case-insensitive matching of model and nvext).
		{name: "keys are case-sensitive", body: `{"Model":"a","MODEL":"b","NVEXT":{"agent_hints":{"priority":2}},"nvext":{"Agent_Hints":{"priority":3},"agent_hints":{"Priority":4}}}`},
		{name: "Kelvin sign is not k", body: "{\"model\":\"m\",\"nve\u212At\":{\"agent_hints\":{\"priority\":3}}}", model: "m"},
		{name: "model not a string", body: `{"model":7}`, wantErr: "field model: number 7 does not fit string"},
		{name: "priority out of range", body: `{"nvext":{"agent_hints":{"priority":3000000000}}}`, wantErr: "field nvext.agent_hints.priority: number 3000000000 does not fit int32"},
		{name: "priority overflows int32", body: `{"nvext":{"agent_hints":{"priority":2147483648}}}`, wantErr: "field nvext.agent_hints.priority"},
		{name: "negative strict priority", body: `{"nvext":{"agent_hints":{"strict_priority":-1}}}`, wantErr: "field nvext.agent_hints.strict_priority"},
		{name: "minus zero is not unsigned", body: `{"nvext":{"agent_hints":{"osl":-0}}}`, wantErr: "field nvext.agent_hints.osl"},
		{name: "fractional priority", body: `{"nvext":{"agent_hints":{"priority":1.5}}}`, wantErr: "field nvext.agent_hints.priority: number 1.5 does not fit int32"},
		{name: "exponent priority", body: `{"nvext":{"agent_hints":{"priority":1e3}}}`, wantErr: "field nvext.agent_hints.priority"},
		{name: "string priority", body: `{"nvext":{"agent_hints":{"priority":"high"}}}`, wantErr: "field nvext.agent_hints.priority: string does not fit int32"},
		{name: "bool hint", body: `{"nvext":{"agent_hints":{"speculative_prefill":1}}}`, wantErr: "field nvext.agent_hints.speculative_prefill: number 1 does not fit bool"},
		{name: "nvext not an object", body: `{"nvext":5}`, wantErr: "field nvext: number 5 does not fit an object"},
		{name: "agent_hints not an object", body: `{"nvext":{"agent_hints":[]}}`, wantErr: "field nvext.agent_hints: array does not fit an object"},
		{name: "long number is not quoted", body: `{"model":` + strings.Repeat("9", 40) + `}`, wantErr: "field model: number does not fit string"},
		{name: "not an object", body: `[1]`, wantErr: "malformed JSON"},
		{name: "truncated", body: `{"model":"m","nvext":{`, wantErr: "malformed JSON"},
		{name: "empty", body: ``, wantErr: "request body is empty"},
		{name: "trailing garbage", body: `{} x`, wantErr: "malformed JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := extractFields(tt.body)
			ref, refErr := refFields([]byte(tt.body))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				if refErr == nil && json.Valid([]byte(tt.body)) {
					t.Fatalf("reference accepts a body the test expects to fail")
				}
				return
			}
			if err != nil {
				t.Fatalf("Extract: %v", err)
			}
			if refErr != nil {
				t.Fatalf("reference: %v", refErr)
			}
			if got.Model != tt.model || got.Hints != tt.hints {
				t.Errorf("model %q hints %+v, want %q %+v", got.Model, got.Hints, tt.model, tt.hints)
			}
			if !sameFields(got, ref) {
				t.Errorf("fields %+v, reference %+v", got, ref)
			}
		})
	}
}

// TestExtractMaxTokens: the output bound is read leniently (a value the
// picker cannot use reads as absent, never as an error: the engine judges
// it), max_completion_tokens wins over max_tokens, and the last duplicate
// of each wins.
func TestExtractMaxTokens(t *testing.T) {
	tests := []struct {
		name string
		body string
		want uint32
		has  bool
	}{
		{"max_tokens", `{"prompt":"x","max_tokens":128}`, 128, true},
		{"max_completion_tokens", `{"messages":[],"max_completion_tokens":64}`, 64, true},
		{"completion wins, either order", `{"max_completion_tokens":64,"max_tokens":128}`, 64, true},
		{"completion wins over a later max_tokens", `{"max_tokens":128,"max_completion_tokens":64}`, 64, true},
		{"absent", `{"prompt":"x"}`, 0, false},
		{"zero", `{"max_tokens":0}`, 0, true},
		{"uint32 max", `{"max_tokens":4294967295}`, math.MaxUint32, true},
		{"over uint32", `{"max_tokens":4294967296}`, 0, false},
		{"null clears an earlier one", `{"max_tokens":5,"max_tokens":null}`, 0, false},
		{"last duplicate wins", `{"max_tokens":5,"max_tokens":7}`, 7, true},
		{"fraction is absent", `{"max_tokens":1.5}`, 0, false},
		{"exponent is absent", `{"max_tokens":1e3}`, 0, false},
		{"negative is absent", `{"max_tokens":-1}`, 0, false},
		{"string is absent", `{"max_tokens":"12"}`, 0, false},
		{"a bad completion bound falls back to max_tokens", `{"max_tokens":9,"max_completion_tokens":"x"}`, 9, true},
		{"object is absent", `{"max_tokens":{"a":1}}`, 0, false},
		{"whitespace around", `{"max_tokens" :  12  }`, 12, true},
		{"nested is not top-level", `{"nvext":{"max_tokens":3}}`, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := extractFields(tt.body)
			if err != nil {
				t.Fatalf("Extract: %v", err)
			}
			if got.MaxTokens != tt.want || got.HasMaxTokens != tt.has {
				t.Errorf("MaxTokens %d (has %t), want %d (has %t)", got.MaxTokens, got.HasMaxTokens, tt.want, tt.has)
			}
			ref, err := refFields([]byte(tt.body))
			if err != nil {
				t.Fatalf("reference: %v", err)
			}
			if !sameFields(got, ref) {
				t.Errorf("fields %+v, reference %+v", got, ref)
			}
		})
	}
}

func TestExtractFieldErrors(t *testing.T) {
	_, err := extractFields(`{"prompt":"secret words","nvext":{"agent_hints":{"priority":"secret"}}}`)
	if !errors.Is(err, ErrFieldType) || strings.Contains(err.Error(), "secret") {
		t.Fatalf("error %v should wrap ErrFieldType and not quote the body", err)
	}
	if _, err := ExtractPrompt(nil, []byte(`{"prompt":"x","model":7,"nvext":5}`)); err != nil {
		t.Fatalf("without fields, ExtractPrompt checks no field types: %v", err)
	}
}

func TestPrioritySpans(t *testing.T) {
	tests := []struct {
		name  string
		body  string
		open  int
		empty bool
		want  []string // the values' bytes
	}{
		{"none", `{"model":"m","prompt":"hi"}`, 0, false, nil},
		{"empty object", ` { } `, 1, true, nil},
		{"one, kept byte for byte", `{"a": 1.50e0, "priority" : 7 ,"z":[1, {"priority":9}]}`, 0, false, []string{"7"}},
		{"nested members are not top-level", `{"nvext":{"priority":1},"x":"priority"}`, 0, false, nil},
		{"every duplicate", `{"priority":1,"b":{},"priority":"x"}`, 0, false, []string{"1", `"x"`}},
		{"escaped key", `{"priorit\u0079":null}`, 0, false, []string{"null"}},
		{"case-sensitive", `{"Priority":1,"PRIORITY":2}`, 0, false, nil},
		{"strings with braces and escapes", `{"s":"}\"{[","priority":[1,2]}`, 0, false, []string{"[1,2]"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := extractFields(tt.body)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, v := range f.Priority.Values {
				got = append(got, tt.body[v.Start:v.End])
			}
			if f.Priority.Open != tt.open || f.Priority.Empty != tt.empty || !slices.Equal(got, tt.want) {
				t.Errorf("open %d empty %v values %q, want %d %v %q", f.Priority.Open, f.Priority.Empty, got, tt.open, tt.empty, tt.want)
			}
			if ref, err := refFields([]byte(tt.body)); err != nil || !sameFields(f, ref) {
				t.Errorf("reference %+v (%v), got %+v", ref, err, f)
			}
		})
	}
}

func TestExtractFieldsReuseDoesNotAllocate(t *testing.T) {
	body := []byte(`{"model":"m","priority":3,"prompt":"` + strings.Repeat("some words here ", 64) +
		`","nvext":{"agent_hints":{"priority":-2,"strict_priority":1,"osl":7,"speculative_prefill":false}},"priority":null}`)
	dst := make([]uint32, 0, 1024)
	var f Fields
	allocs := testing.AllocsPerRun(100, func() {
		var err error
		if dst, err = Extract(dst[:0], body, &f); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Extract allocates %.1f times per body, want 0", allocs)
	}
	if f.Model != "m" || f.Hints.Priority != -2 || len(f.Priority.Values) != 2 {
		t.Errorf("fields %+v", f)
	}
}
