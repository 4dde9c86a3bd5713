package epp

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/laneway-dev/laneway/pkg/tokenize"
)

// spansOf is the parser's view of body for the splice: the priority spans
// from tokenize.Extract (a body without a prompt is fine here).
func spansOf(body []byte) (*tokenize.PrioritySpans, error) {
	var f tokenize.Fields
	if _, err := tokenize.Extract(nil, body, &f); err != nil && !errors.Is(err, tokenize.ErrNoPrompt) {
		return nil, err
	}
	return &f.Priority, nil
}

func TestSplicePriority(t *testing.T) {
	cases := []struct {
		name, in, want string
		v              int64
		err            bool // the parser rejects the body: nothing to splice
	}{
		{"insert into object", `{"model":"m","prompt":"hi"}`, `{"priority":-5,"model":"m","prompt":"hi"}`, -5, false},
		{"insert into empty object", ` { } `, ` {"priority":3 } `, 3, false},
		{"replace keeps the rest byte for byte", `{"a": 1.50e0, "priority" : 7 ,"z":[1, {"priority":9}]}`, `{"a": 1.50e0, "priority" : 12 ,"z":[1, {"priority":9}]}`, 12, false},
		{"nested members are not touched", `{"nvext":{"priority":1},"x":"priority"}`, `{"priority":-2147483648,"nvext":{"priority":1},"x":"priority"}`, -2147483648, false},
		{"keep only the last of duplicates", `{"priority":1,"b":{},"priority":"x"}`, `{"b":{},"priority":4}`, 4, false},
		{"duplicates next to each other, with spaces", `{ "priority" : 1 , "priority":2 ,"priority":3}`, `{  "priority":9}`, 9, false},
		{"escaped key", `{"priorit\u0079":null}`, `{"priorit\u0079":0}`, 0, false},
		{"strings with braces and escapes", `{"s":"}\"{[","priority":[1,2]}`, `{"s":"}\"{[","priority":5}`, 5, false},
		{"not an object", `[1,2]`, ``, 1, true},
		{"empty", ``, ``, 1, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			at, err := spansOf([]byte(tc.in))
			if (err != nil) != tc.err {
				t.Fatalf("parse err = %v, want error %v", err, tc.err)
			}
			if tc.err {
				return
			}
			got, ok := splicePriority([]byte(tc.in), at, tc.v)
			if !ok {
				t.Fatalf("spans %+v do not fit the body", at)
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

// TestSpliceKeepsOnePriority: a body of many top-level priority members
// (the audit's 16 MiB body had 1.29 million) is forwarded with one, the
// last one's place, so the replacement is never more than the digits of
// the new value longer than the body: it cannot pass --max-body-bytes or
// the held-bytes budget by more than that.
func TestSpliceKeepsOnePriority(t *testing.T) {
	const members = 100_000
	body := []byte("{" + strings.Repeat(`"priority":0,`, members) + `"prompt":"hi","priority":0}`)
	at, err := spansOf(body)
	if err != nil || len(at.Values) != members+1 {
		t.Fatalf("parse: %v, %d priority members; want %d", err, len(at.Values), members+1)
	}
	got, ok := splicePriority(body, at, -2147483648)
	if !ok {
		t.Fatal("spans do not fit")
	}
	if want := `{"prompt":"hi","priority":-2147483648}`; string(got) != want {
		t.Fatalf("got %.200s (%d bytes), want %s", got, len(got), want)
	}
}

// TestDropPriority: without a priority to forward, every top-level
// priority member goes, wherever it is, with one comma; nested ones stay.
func TestDropPriority(t *testing.T) {
	cases := []struct{ in, want string }{
		{`{"priority":1}`, `{}`},
		{` { "priority" : 1 } `, ` {  } `},
		{`{"priority":1,"a":2}`, `{"a":2}`},
		{`{"a":2,"priority":1}`, `{"a":2}`},
		{`{"a":2 , "priority":1 }`, `{"a":2   }`},
		{`{"priority":1,"priority":2}`, `{}`},
		{`{"a":0,"priority":1,"priority":2}`, `{"a":0}`},
		{`{"priority":1,"a":0,"priority":2,"b":{"priority":3},"priority":4}`, `{"a":0,"b":{"priority":3}}`},
		{`{"a":0}`, ``}, // nothing to drop: the body goes unchanged
	}
	for _, tc := range cases {
		at, err := spansOf([]byte(tc.in))
		if err != nil {
			t.Fatalf("%s: %v", tc.in, err)
		}
		got, ok := dropPriority([]byte(tc.in), at)
		if !ok || string(got) != tc.want {
			t.Errorf("drop from %s: %q (fit %t), want %q", tc.in, got, ok, tc.want)
		}
	}
}

func TestSplicePriorityRejectsSpansThatDoNotFit(t *testing.T) {
	body := []byte(`{"priority":1}`)
	for _, at := range []tokenize.PrioritySpans{
		{Open: 3},
		{Open: len(body)},
		{Open: 0, Values: []tokenize.Span{{Start: 12, End: 20}}, Keys: []int{1}},
		{Open: 0, Values: []tokenize.Span{{Start: 12, End: 13}, {Start: 2, End: 3}}, Keys: []int{1, 1}},
		{Open: 0, Values: []tokenize.Span{{Start: 12, End: 13}}},                  // no key
		{Open: 0, Values: []tokenize.Span{{Start: 12, End: 13}}, Keys: []int{13}}, // key after its value
	} {
		if out, ok := splicePriority(body, &at, 5); ok {
			t.Errorf("spans %+v spliced into %s", at, out)
		}
	}
}

// decoderMembers lists an object's top-level members as encoding/json
// reads them: each key decoded and each value's exact bytes.
func decoderMembers(body []byte) (keys, values []string, err error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, nil, errors.New("not an object")
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, err
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, nil, err
		}
		keys = append(keys, tok.(string))
		values = append(values, string(raw))
	}
	if _, err := dec.Token(); err != nil {
		return nil, nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, nil, errors.New("trailing data")
	}
	return keys, values, nil
}

// memberBodies are valid objects that exercise the parser's member walk:
// escapes next to quotes, structural bytes inside strings, nesting, and
// priority members in every position.
func memberBodies() []string {
	bodies := []string{
		`{}`,
		` { } `,
		`{"a":1}`,
		`{"model":"m","prompt":[1,2,3],"max_tokens":1,"stream":true}`,
		`{"s":"a\"b","t":"\\","u":"\\\"","v":"\\\\\\\"]","priority":3}`,
		`{"s":"}{][\"","n":null,"f":false,"x":-1.5e+10,"priority":null}`,
		`{"a":[[],[[]],{"b":{"c":[1,{"d":"]"}]}}],"e":{},"priority":{"priority":1}}`,
		`{"k\u0065y":"v","\"q\"":["\"",{"\\":"\\\\"}],"pr\u0069ority":"x"}`,
		"{\"a\" :\n\t[ 1 , 2 ] ,\r\n \"priority\" : { \"c\" : \"d\" } }",
		`{"utf8":"modèle 日本 🚀","esc":"\u00e9\ud83d\ude80","priority":1,"priority":2}`,
		`{"prompt":"` + strings.Repeat("The quick brown fox. ", 200) + `","model":"m"}`,
		`{"Priority":1,"PRIORITY":2}`,
	}
	for off := range 16 {
		pad := strings.Repeat("1,", off)
		bodies = append(bodies,
			`{"p":[`+pad+`[2],{"x":"]"},"}"],"priority":[`+pad+`0]}`,
			`{"p":"`+strings.Repeat("a", off)+`\"\\","priority":7}`,
		)
	}
	return bodies
}

// FuzzSplicePriority checks the splice against encoding/json on every body
// the parser accepts: afterwards exactly one top-level priority member is
// left, where the last one was (or inserted first), holding v; every
// other member is byte for byte what it was; and the body grew by no more
// than the inserted member. Dropping the priority leaves every other
// member as it was, and no priority.
func FuzzSplicePriority(f *testing.F) {
	for _, b := range memberBodies() {
		f.Add([]byte(b), int64(-7))
	}
	f.Fuzz(func(t *testing.T, body []byte, v int64) {
		at, err := spansOf(body)
		if err != nil {
			return
		}
		keys, values, err := decoderMembers(body)
		if err != nil {
			t.Fatalf("the parser accepted a body encoding/json rejects: %v", err)
		}
		out, ok := splicePriority(body, at, v)
		if !ok {
			t.Fatalf("spans %+v do not fit the body", at)
		}
		gotKeys, gotValues, err := decoderMembers(out)
		if err != nil {
			t.Fatalf("spliced body is not a JSON object: %v", err)
		}
		want := strconv.FormatInt(v, 10)
		lastAt := -1
		for i, k := range keys {
			if k == "priority" {
				lastAt = i
			}
		}
		var wantKeys, wantValues []string
		if lastAt < 0 {
			wantKeys, wantValues = []string{"priority"}, []string{want}
		}
		for i, k := range keys {
			switch {
			case i == lastAt:
				wantKeys, wantValues = append(wantKeys, k), append(wantValues, want)
			case k != "priority":
				wantKeys, wantValues = append(wantKeys, k), append(wantValues, values[i])
			}
		}
		if !slices.Equal(gotKeys, wantKeys) || !slices.Equal(gotValues, wantValues) {
			t.Fatalf("members %q: %q, want %q: %q", gotKeys, gotValues, wantKeys, wantValues)
		}
		if limit := len(body) + len(`"priority":,`) + len(want); len(out) > limit {
			t.Fatalf("spliced body of %d bytes, more than %d (%d and the member)", len(out), limit, len(body))
		}

		// Without a priority to forward every top-level one goes.
		dropped, ok := dropPriority(body, at)
		if !ok {
			t.Fatalf("spans %+v do not fit the body", at)
		}
		if dropped == nil {
			dropped = body
		}
		gotKeys, gotValues, err = decoderMembers(dropped)
		if err != nil {
			t.Fatalf("body without its priority is not a JSON object: %v\n%s", err, dropped)
		}
		wantKeys, wantValues = nil, nil
		for i, k := range keys {
			if k != "priority" {
				wantKeys, wantValues = append(wantKeys, k), append(wantValues, values[i])
			}
		}
		if !slices.Equal(gotKeys, wantKeys) || !slices.Equal(gotValues, wantValues) {
			t.Fatalf("members without priority %q: %q, want %q: %q", gotKeys, gotValues, wantKeys, wantValues)
		}
	})
}
