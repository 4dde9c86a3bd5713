package tokenize

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// refExtract is a slow, obviously-correct ExtractPrompt built on
// encoding/json: the oracle for the table tests and the fuzz target.
func refExtract(body []byte) ([]uint32, error) {
	if !json.Valid(body) {
		return nil, ErrSyntax
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var top map[string]any
	if err := dec.Decode(&top); err != nil || top == nil {
		return nil, ErrSyntax
	}
	prompt, msgs := top["prompt"], top["messages"]
	switch {
	case prompt != nil && msgs != nil, prompt == nil && msgs == nil:
		return nil, ErrNoPrompt
	case prompt != nil:
		return refPrompt(prompt)
	}
	return refMessages(msgs)
}

func refTokenID(v any) (uint32, error) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, ErrPromptShape
	}
	id, err := strconv.ParseUint(string(n), 10, 32)
	if err != nil {
		return 0, ErrPromptShape
	}
	return uint32(id), nil
}

func refPrompt(p any) ([]uint32, error) {
	switch p := p.(type) {
	case string:
		return Tokenize(nil, p), nil
	case []any:
		var out []uint32
		for _, el := range p {
			// Every element must have the kind of the first.
			if _, isStr := el.(string); isStr != isString(p[0]) {
				return nil, ErrPromptShape
			}
			if _, isArr := el.([]any); isArr != isArray(p[0]) {
				return nil, ErrPromptShape
			}
			switch el := el.(type) {
			case string:
				out = Tokenize(out, el)
			case []any:
				for _, x := range el {
					id, err := refTokenID(x)
					if err != nil {
						return nil, err
					}
					out = append(out, id)
				}
			default:
				id, err := refTokenID(el)
				if err != nil {
					return nil, err
				}
				out = append(out, id)
			}
		}
		return out, nil
	}
	return nil, ErrPromptShape
}

func isString(v any) bool { _, ok := v.(string); return ok }
func isArray(v any) bool  { _, ok := v.([]any); return ok }

func refMessages(m any) ([]uint32, error) {
	list, ok := m.([]any)
	if !ok {
		return nil, ErrPromptShape
	}
	var out []uint32
	for _, el := range list {
		msg, ok := el.(map[string]any)
		if !ok {
			return nil, ErrPromptShape
		}
		out = append(out, msgStart)
		switch c := msg["content"].(type) {
		case nil:
		case string:
			out = Tokenize(out, c)
		case []any:
			for _, part := range c {
				pm, ok := part.(map[string]any)
				if !ok {
					return nil, ErrPromptShape
				}
				switch tx := pm["text"].(type) {
				case nil:
				case string:
					out = Tokenize(out, tx)
				default:
					return nil, ErrPromptShape
				}
			}
		default:
			return nil, ErrPromptShape
		}
		out = append(out, msgRole)
		switch r := msg["role"].(type) {
		case nil:
		case string:
			out = Tokenize(out, r)
		default:
			return nil, ErrPromptShape
		}
		out = append(out, msgEnd)
	}
	return append(out, genPrompt), nil
}

func TestExtractPrompt(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    []uint32 // nil: compare with refExtract only
		wantErr error
	}{
		{name: "completion string", body: `{"model":"m","prompt":"Hello world","max_tokens":1}`,
			want: Tokenize(nil, "Hello world")},
		{name: "token ids exact", body: `{"prompt":[1000, 1001,0 ,4294967295]}`,
			want: []uint32{1000, 1001, 0, 4294967295}},
		{name: "ids with odd spacing", body: "{\"prompt\":[ 1 ,\n2\t,3\r]}", want: []uint32{1, 2, 3}},
		{name: "ids leading zero later", body: `{"prompt":[1,01]}`, wantErr: ErrSyntax},
		{name: "ids overflow later", body: `{"prompt":[4294967295,4294967296]}`, wantErr: ErrPromptShape},
		{name: "ids long digit run", body: `{"prompt":[00000000000000000001]}`, wantErr: ErrSyntax},
		{name: "ids trailing comma", body: `{"prompt":[1,]}`, wantErr: ErrSyntax},
		{name: "ids missing comma", body: `{"prompt":[1 2]}`, wantErr: ErrSyntax},
		{name: "ids then string", body: `{"prompt":[1,"a"]}`, wantErr: ErrPromptShape},
		{name: "ids then fraction", body: `{"prompt":[1,2.5]}`, wantErr: ErrPromptShape},
		{name: "nested ids leading zero", body: `{"prompt":[[1,01]]}`, wantErr: ErrSyntax},
		{name: "ids zero", body: `{"prompt":[0,0]}`, want: []uint32{0, 0}},
		{name: "array of token-id arrays", body: `{"prompt":[[1,2],[],[3]]}`, want: []uint32{1, 2, 3}},
		{name: "array of strings", body: `{"prompt":["ab","cd"]}`,
			want: append(Tokenize(nil, "ab"), Tokenize(nil, "cd")...)},
		{name: "empty array", body: `{"prompt":[]}`, want: []uint32{}},
		{name: "empty string", body: `{"prompt":""}`, want: []uint32{}},
		{name: "escapes decode", body: `{"prompt":"a\nb \u00e9\ud83d\ude00 \"q\""}`,
			want: Tokenize(nil, "a\nb é😀 \"q\"")},
		{name: "lone surrogate is U+FFFD", body: `{"prompt":"x\ud800y"}`, want: Tokenize(nil, "x\uFFFDy")},
		{name: "escaped key", body: `{"pr\u006fmpt":"hi"}`, want: Tokenize(nil, "hi")},
		{name: "last duplicate wins", body: `{"prompt":"first words here","prompt":"second"}`,
			want: Tokenize(nil, "second")},
		{name: "null then value", body: `{"prompt":null,"prompt":[5]}`, want: []uint32{5}},
		{name: "value then null", body: `{"prompt":[5],"prompt":null}`, wantErr: ErrNoPrompt},
		{name: "other fields validated and skipped", body: `{"a":{"b":[1,-2.5e3,true,false,null,"s"]},"prompt":[9],"z":{}}`,
			want: []uint32{9}},
		{name: "chat string content", body: `{"messages":[{"role":"user","content":"Hi there"}]}`,
			want: slices.Concat([]uint32{msgStart}, Tokenize(nil, "Hi there"), []uint32{msgRole}, Tokenize(nil, "user"), []uint32{msgEnd, genPrompt})},
		{name: "chat key order does not matter", body: `{"messages":[{"content":"Hi there","role":"user"}]}`,
			want: slices.Concat([]uint32{msgStart}, Tokenize(nil, "Hi there"), []uint32{msgRole}, Tokenize(nil, "user"), []uint32{msgEnd, genPrompt})},
		{name: "chat parts", body: `{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}},{"text":"b","type":"text"}]}]}`},
		{name: "chat null content", body: `{"messages":[{"role":"assistant","content":null,"tool_calls":[]}]}`},
		{name: "chat duplicate content", body: `{"messages":[{"content":"one two three","role":"user","content":"four"}]}`},
		{name: "chat duplicate part text", body: `{"messages":[{"content":[{"text":"one two","text":"x"}]}]}`},
		{name: "chat empty", body: `{"messages":[]}`, want: []uint32{genPrompt}},
		{name: "chat escaped role", body: `{"messages":[{"role":"us\u0065r","content":"x"}]}`},
		{name: "no prompt", body: `{"model":"m"}`, wantErr: ErrNoPrompt},
		{name: "null prompt", body: `{"prompt":null}`, wantErr: ErrNoPrompt},
		{name: "both prompt and messages", body: `{"prompt":"a","messages":[]}`, wantErr: ErrNoPrompt},
		{name: "number prompt", body: `{"prompt":5}`, wantErr: ErrPromptShape},
		{name: "object prompt", body: `{"prompt":{"a":1}}`, wantErr: ErrPromptShape},
		{name: "mixed array", body: `{"prompt":["a",1]}`, wantErr: ErrPromptShape},
		{name: "mixed array 2", body: `{"prompt":[1,[2]]}`, wantErr: ErrPromptShape},
		{name: "negative id", body: `{"prompt":[-1]}`, wantErr: ErrPromptShape},
		{name: "fractional id", body: `{"prompt":[1.0]}`, wantErr: ErrPromptShape},
		{name: "exponent id", body: `{"prompt":[1e3]}`, wantErr: ErrPromptShape},
		{name: "id above uint32", body: `{"prompt":[4294967296]}`, wantErr: ErrPromptShape},
		{name: "messages not array", body: `{"messages":"hi"}`, wantErr: ErrPromptShape},
		{name: "message not object", body: `{"messages":["hi"]}`, wantErr: ErrPromptShape},
		{name: "role not string", body: `{"messages":[{"role":1}]}`, wantErr: ErrPromptShape},
		{name: "content number", body: `{"messages":[{"content":1}]}`, wantErr: ErrPromptShape},
		{name: "part text number", body: `{"messages":[{"content":[{"text":1}]}]}`, wantErr: ErrPromptShape},
		{name: "empty body", body: ``, wantErr: ErrSyntax},
		{name: "not an object", body: `["prompt"]`, wantErr: ErrSyntax},
		{name: "trailing data", body: `{"prompt":"a"} x`, wantErr: ErrSyntax},
		{name: "truncated", body: `{"prompt":"abc`, wantErr: ErrSyntax},
		{name: "truncated ids", body: `{"prompt":[1,2`, wantErr: ErrSyntax},
		{name: "leading zero", body: `{"prompt":[01]}`, wantErr: ErrSyntax},
		{name: "control char", body: "{\"prompt\":\"a\x01\"}", wantErr: ErrSyntax},
		{name: "bad escape", body: `{"prompt":"\x"}`, wantErr: ErrSyntax},
		{name: "single-quote escape", body: `{"prompt":"\'"}`, wantErr: ErrSyntax},
		{name: "bad literal", body: `{"a":nul,"prompt":"x"}`, wantErr: ErrSyntax},
		{name: "trailing comma", body: `{"prompt":"x",}`, wantErr: ErrSyntax},
		{name: "missing colon", body: `{"prompt" "x"}`, wantErr: ErrSyntax},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := []uint32{42}
			got, err := ExtractPrompt(slices.Clone(prefix), []byte(tt.body))
			ref, refErr := refExtract([]byte(tt.body))
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				if refErr == nil {
					t.Fatalf("reference accepted a body the test expects to fail")
				}
				if !slices.Equal(got, prefix) {
					t.Fatalf("dst not restored on error: %v", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error %v", err)
			}
			if refErr != nil {
				t.Fatalf("reference failed: %v", refErr)
			}
			if got[0] != 42 {
				t.Fatalf("dst prefix overwritten")
			}
			got = got[1:]
			if !slices.Equal(got, ref) {
				t.Fatalf("tokens = %v, reference %v", got, ref)
			}
			if tt.want != nil && !slices.Equal(got, tt.want) {
				t.Fatalf("tokens = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestExtractPromptErrorHidesBody(t *testing.T) {
	_, err := ExtractPrompt(nil, []byte(`{"prompt":"secret words","prompt":5}`))
	if err == nil || strings.Contains(err.Error(), "secret") {
		t.Fatalf("error %v should exist and not quote the body", err)
	}
}

func TestExtractPromptDepthLimit(t *testing.T) {
	deep := `{"a":` + strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth) + `,"prompt":"x"}`
	if _, err := ExtractPrompt(nil, []byte(deep)); !errors.Is(err, ErrSyntax) {
		t.Fatalf("depth %d: err = %v, want ErrSyntax", maxDepth+1, err)
	}
	ok := `{"a":` + strings.Repeat("[", maxDepth-1) + strings.Repeat("]", maxDepth-1) + `,"prompt":"x"}`
	if _, err := ExtractPrompt(nil, []byte(ok)); err != nil {
		t.Fatalf("depth %d: err = %v, want nil", maxDepth, err)
	}
	// Every container the chat and fields paths enter is left again: the
	// limit is where it is after them.
	chat := `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{}]},{},{"content":[]}],` +
		`"nvext":{"agent_hints":{"priority":1},"x":{}},"a":`
	var f Fields
	if _, err := Extract(nil, []byte(chat+strings.Repeat("[", maxDepth-1)+strings.Repeat("]", maxDepth-1)+`}`), &f); err != nil {
		t.Fatalf("depth %d after chat and fields: err = %v, want nil", maxDepth, err)
	}
	if _, err := Extract(nil, []byte(chat+strings.Repeat("[", maxDepth)+strings.Repeat("]", maxDepth)+`}`), &f); !errors.Is(err, ErrSyntax) {
		t.Fatalf("depth %d after chat and fields: err = %v, want ErrSyntax", maxDepth+1, err)
	}
}

// FuzzExtractPrompt checks Extract against the references: the tokens
// against refExtract (encoding/json and the byte-at-a-time Tokenize), the
// fields (model, agent hints, priority spans, output bound) against refFields
// (encoding/json), and that it fails exactly when one of them does.
func FuzzExtractPrompt(f *testing.F) {
	for _, s := range []string{
		`{"prompt":"Hello, world!"}`,
		`{"prompt":[1000,1001,1002]}`,
		`{"prompt":[[1,2],[3]]}`,
		`{"prompt":["a","b c"]}`,
		`{"messages":[{"role":"user","content":"hi"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"x\u00e9"}]}],"stream":true}`,
		`{"prompt":"\ud83d\ude00\ud800","prompt":null,"messages":[]}`,
		`{"a":[1,{"b":null}],"prompt":[4294967295]}`,
		`{"model":"m","priority":1,"prompt":"x","nvext":{"agent_hints":{"priority":-3,"latency_sensitivity":2,"strict_priority":1,"osl":9,"speculative_prefill":true}},"priority":[2]}`,
		`{"nvext":{"agent_hints":{"priority":1}},"nvext":{"agent_hints":null},"model":"a\"b","prompt":[1]}`,
		`{"prompt":"x","max_tokens":16,"max_completion_tokens":"8","max_tokens":1.5,"max_completion_tokens":4294967295}`,
		`{"prompt":"` + strings.Repeat("The quick brown fox jumps over the lazy dog. ", 8) + `"}`,
		`{"prompt":"` + strings.Repeat("internationalization   1234567 ...!?  \n\t\u00e9x ", 6) + `"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var fields Fields
		got, err := Extract(nil, body, &fields)
		if !utf8.Valid(body) {
			// encoding/json rewrites invalid UTF-8; only check for panics.
			return
		}
		ref, refErr := refExtract(body)
		refF, refFErr := refFields(body)
		if (err == nil) != (refErr == nil && refFErr == nil) {
			t.Fatalf("Extract err = %v, reference errors %v, %v", err, refErr, refFErr)
		}
		if err == nil && !slices.Equal(got, ref) {
			t.Fatalf("tokens differ from reference: got %d, want %d", len(got), len(ref))
		}
		if (err == nil || errors.Is(err, ErrNoPrompt)) && !sameFields(fields, refF) {
			t.Fatalf("fields %+v, reference %+v (%v)", fields, refF, refFErr)
		}
	})
}

// FuzzTokenizeString checks the string tokenizer's fast paths (a block of
// 64 bytes, a piece at a time, a byte at a time around escapes) against
// Tokenize on long strings, which random bodies seldom are: text repeated,
// JSON-encoded with its escapes (encoding/json also escapes <, > and &).
func FuzzTokenizeString(f *testing.F) {
	f.Add("The quick brown fox jumps over the lazy dog. ", uint8(20))
	f.Add("a  b   c    d     e      f\n", uint8(9))
	f.Add("internationalization 12345678 ...,,,;;; <&> é日本😀\t", uint8(7))
	f.Add("x\"y", uint8(70))
	f.Fuzz(func(t *testing.T, text string, reps uint8) {
		if !utf8.ValidString(text) {
			return
		}
		long := strings.Repeat(text, 1+int(reps))
		enc, err := json.Marshal(long)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ExtractPrompt(nil, []byte(`{"prompt":`+string(enc)+`}`))
		if err != nil {
			t.Fatalf("ExtractPrompt: %v", err)
		}
		if want := Tokenize(nil, long); !slices.Equal(got, want) {
			t.Fatalf("%d tokens, Tokenize gives %d", len(got), len(want))
		}
	})
}

// FuzzTokenIDPrompt checks that token-id prompts count exactly.
func FuzzTokenIDPrompt(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8}, true)
	f.Fuzz(func(t *testing.T, raw []byte, nested bool) {
		var ids []uint32
		for len(raw) >= 4 {
			ids = append(ids, uint32(raw[0])|uint32(raw[1])<<8|uint32(raw[2])<<16|uint32(raw[3])<<24)
			raw = raw[4:]
		}
		var sb strings.Builder
		sb.WriteString(`{"prompt":[`)
		if nested {
			sb.WriteString("[")
		}
		for i, id := range ids {
			if i > 0 {
				sb.WriteString(", ")
			}
			fmt.Fprint(&sb, id)
		}
		if nested {
			sb.WriteString("]")
		}
		sb.WriteString("]}")
		got, err := ExtractPrompt(nil, []byte(sb.String()))
		if err != nil {
			t.Fatalf("ExtractPrompt: %v", err)
		}
		if !slices.Equal(got, ids) && !(len(got) == 0 && len(ids) == 0) {
			t.Fatalf("got %d ids, want %d exactly", len(got), len(ids))
		}
	})
}

// bigPrompt returns a completions body whose prompt is about n estimated
// tokens of English text.
func bigPrompt(n int) []byte {
	perCopy := CountTokens(englishSample + " ")
	text := strings.Repeat(englishSample+" ", n/perCopy+1)
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": text, "max_tokens": 1, "stream": true})
	return body
}

func BenchmarkExtractPrompt32kText(b *testing.B) {
	body := bigPrompt(32768)
	dst, err := ExtractPrompt(nil, body)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(len(dst)), "tokens")
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		dst, _ = ExtractPrompt(dst[:0], body)
	}
}

func BenchmarkExtractPrompt32kTextFreshDst(b *testing.B) {
	body := bigPrompt(32768)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ExtractPrompt(nil, body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkExtractPrompt32kTokenIDs(b *testing.B) {
	ids := make([]uint32, 32768)
	for i := range ids {
		ids[i] = uint32(i*7919) % 152000
	}
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": ids})
	dst := make([]uint32, 0, len(ids))
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		dst, _ = ExtractPrompt(dst[:0], body)
	}
}

func BenchmarkBlockHashes32k(b *testing.B) {
	tokens, _ := ExtractPrompt(nil, bigPrompt(32768))
	tokens = tokens[:32768]
	dst := make([]uint64, 0, len(tokens)/16)
	b.SetBytes(int64(4 * len(tokens)))
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendBlockHashes(dst[:0], tokens, 16)
	}
}

// TestTokStringBlockEdges drives the 64-byte block path across its edges:
// runs longer than any piece, lone spaces and escapes at every offset of a
// block, digits next to punctuation, and a block boundary inside each.
func TestTokStringBlockEdges(t *testing.T) {
	fills := []string{
		"internationalization",
		"a b  c   d    e     f      g",
		"1234567890.,;:!?()[]{}<>=+-*/12.5e3",
		"x\ny\tz\u00e9\U0001F600 q\"r\\s",
		"     \n     ",
	}
	for _, fill := range fills {
		for off := range 80 {
			text := strings.Repeat("w", off) + " " + strings.Repeat(fill+" ", 12) + strings.Repeat("v", 80-off)
			enc, _ := json.Marshal(text)
			got, err := ExtractPrompt(nil, []byte(`{"prompt":`+string(enc)+`}`))
			if err != nil {
				t.Fatalf("fill %q offset %d: %v", fill, off, err)
			}
			if want := Tokenize(nil, text); !slices.Equal(got, want) {
				t.Fatalf("fill %q offset %d: %d tokens, Tokenize gives %d", fill, off, len(got), len(want))
			}
		}
	}
	for off := range 80 {
		body := `{"prompt":"` + strings.Repeat("word ", 30)[:off] + "\x01" + strings.Repeat("word ", 30) + `"}`
		if _, err := ExtractPrompt(nil, []byte(body)); !errors.Is(err, ErrSyntax) {
			t.Fatalf("control character at %d: err = %v, want ErrSyntax", off, err)
		}
	}
}

func TestPackHighs(t *testing.T) {
	for _, lanes := range []uint8{0, 1, 0x80, 0xa5, 0xff, 0x3c} {
		var w uint64
		for j := range 8 {
			if lanes>>j&1 != 0 {
				w |= 0x80 << (8 * j)
			}
		}
		if got := uint8(w * packHighs >> 56); got != lanes {
			t.Errorf("packHighs of lanes %08b = %08b", lanes, got)
		}
	}
	const w = 0x1122_3344_5566_7788
	for n := range lenMask {
		if got, want := uint32(fmix64(w&lenMask[n]^lenSeed[n])), pieceID(w&(1<<(8*n)-1), uint8(n)); got != want {
			t.Errorf("lenSeed[%d]: id %#x, pieceID %#x", n, got, want)
		}
	}
}
