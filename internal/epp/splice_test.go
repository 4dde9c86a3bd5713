package epp

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
)

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

// checkMembers compares forEachMember with encoding/json on a valid body.
func checkMembers(t *testing.T, body []byte) {
	t.Helper()
	wantKeys, wantValues, err := decoderMembers(body)
	if err != nil {
		t.Fatalf("the oracle rejects %q: %v", body, err)
	}
	var keys, values []string
	if _, err := forEachMember(body, func(k []byte, vs, ve int) error {
		key, ok := unquoteKey(k) // as encoding/json decodes it (invalid UTF-8 replaced)
		if !ok {
			t.Errorf("key %s does not decode", k)
		}
		keys = append(keys, key)
		values = append(values, string(body[vs:ve]))
		return nil
	}); err != nil {
		t.Fatalf("forEachMember(%q): %v", body, err)
	}
	if !slices.Equal(keys, wantKeys) || !slices.Equal(values, wantValues) {
		t.Errorf("forEachMember(%q)\n got keys %q values %q\nwant keys %q values %q", body, keys, values, wantKeys, wantValues)
	}
}

// memberBodies are valid objects that exercise the scanner: escapes next
// to quotes, structural bytes inside strings, nesting, and structural
// bytes at every offset of an 8-byte word.
func memberBodies() []string {
	bodies := []string{
		`{}`,
		` { } `,
		`{"a":1}`,
		`{"model":"m","prompt":[1,2,3],"max_tokens":1,"stream":true}`,
		`{"s":"a\"b","t":"\\","u":"\\\"","v":"\\\\\\\"]"}`,
		`{"s":"}{][\"","n":null,"f":false,"x":-1.5e+10}`,
		`{"a":[[],[[]],{"b":{"c":[1,{"d":"]"}]}}],"e":{}}`,
		`{"k\u0065y":"v","\"q\"":["\"",{"\\":"\\\\"}]}`,
		"{\"a\" :\n\t[ 1 , 2 ] ,\r\n \"b\" : { \"c\" : \"d\" } }",
		`{"utf8":"modèle 日本 🚀","esc":"\u00e9\ud83d\ude80"}`,
		`{"prompt":"` + strings.Repeat("The quick brown fox. ", 200) + `","model":"m"}`,
	}
	// A structural byte at each offset of a word, inside a long array.
	for off := range 16 {
		pad := strings.Repeat("1,", off)
		bodies = append(bodies,
			`{"p":[`+pad+`[2],{"x":"]"},"}"],"m":"x"}`,
			`{"p":"`+strings.Repeat("a", off)+`\"\\"}`,
			`{"p":[`+pad+`"\\\\",3],"q":{`+strings.Repeat(" ", off)+`}}`,
		)
	}
	return bodies
}

func TestForEachMemberAgreesWithEncodingJSON(t *testing.T) {
	for _, b := range memberBodies() {
		checkMembers(t, []byte(b))
	}
}

func TestSkipValueRejectsTruncated(t *testing.T) {
	tests := []string{`"abc`, `"abc\"`, `"abc\\\"`, `[1,2`, `{"a":"]"`, `[[]`, `["]"`, `{"a":[1,2,3,4,5,6,7,8,9,10`}
	for _, v := range tests {
		if _, err := skipValue([]byte(v), 0); err == nil {
			t.Errorf("skipValue(%q) accepted a truncated value", v)
		}
	}
}

// FuzzForEachMember checks the scanner against encoding/json on every
// valid object the fuzzer finds.
func FuzzForEachMember(f *testing.F) {
	for _, b := range memberBodies() {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if !json.Valid(body) {
			return
		}
		if _, _, err := decoderMembers(body); err != nil {
			return // valid JSON but not an object
		}
		checkMembers(t, body)
	})
}
