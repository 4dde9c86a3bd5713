package epp

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"
)

// errNotObject is returned by setTopLevelInt for a body that is not a JSON
// object.
var errNotObject = errors.New("request body is not a JSON object")

// setTopLevelInt returns a copy of the JSON object body whose top-level
// member key has the integer value v: every existing member of that name
// (a decoder keeps the last of duplicates, so all are set) gets its value
// replaced, or, when there is none, the member is inserted first. The rest
// of the body is copied byte for byte, not re-encoded, so numbers, key
// order and unknown fields reach the engine as the client sent them. body
// must be valid JSON (the parser has checked it).
func setTopLevelInt(body []byte, key string, v int64) ([]byte, error) {
	var num [24]byte
	val := strconv.AppendInt(num[:0], v, 10)
	var spans [][2]int // values of the members named key
	open, err := forEachMember(body, func(k []byte, vs, ve int) error {
		if keyEquals(k, key) {
			spans = append(spans, [2]int{vs, ve})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(spans) == 0 {
		out := make([]byte, 0, len(body)+len(key)+len(val)+4)
		out = append(out, body[:open+1]...)
		out = strconv.AppendQuote(out, key)
		out = append(out, ':')
		out = append(out, val...)
		rest := body[open+1:]
		if r := skipSpace(rest, 0); r < len(rest) && rest[r] != '}' {
			out = append(out, ',')
		}
		return append(out, rest...), nil
	}
	out := make([]byte, 0, len(body)+len(spans)*len(val))
	prev := 0
	for _, sp := range spans {
		out = append(out, body[prev:sp[0]]...)
		out = append(out, val...)
		prev = sp[1]
	}
	return append(out, body[prev:]...), nil
}

// forEachMember calls fn with each top-level member of the JSON object
// body, in order: its quoted key and the span [vs, ve) of its value. It
// skips values without decoding them (a long prompt costs a byte scan),
// and returns the index of the object's opening brace. body must be valid
// JSON: this is a scanner, not a validator.
func forEachMember(body []byte, fn func(key []byte, vs, ve int) error) (int, error) {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return 0, errNotObject
	}
	open := i
	i = skipSpace(body, i+1)
	if i < len(body) && body[i] == '}' {
		return open, nil
	}
	for i < len(body) {
		ks := i
		ke, err := skipString(body, i)
		if err != nil {
			return 0, err
		}
		i = skipSpace(body, ke)
		if i >= len(body) || body[i] != ':' {
			return 0, errNotObject
		}
		vs := skipSpace(body, i+1)
		ve, err := skipValue(body, vs)
		if err != nil {
			return 0, err
		}
		if err := fn(body[ks:ke], vs, ve); err != nil {
			return 0, err
		}
		i = skipSpace(body, ve)
		if i < len(body) && body[i] == ',' {
			i = skipSpace(body, i+1)
			continue
		}
		break
	}
	return open, nil
}

// keyEquals compares a quoted JSON key with name, decoding escapes only
// when the key has any.
func keyEquals(quoted []byte, name string) bool {
	inner := quoted[1 : len(quoted)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		return string(inner) == name // compared in place, not copied
	}
	k, ok := unquoteKey(quoted)
	return ok && k == name
}

// keyFolds reports whether a quoted JSON key names the struct field name
// as encoding/json matches it: exactly or case-insensitively (Unicode
// simple folding, as strings.EqualFold).
func keyFolds(quoted []byte, name string) bool {
	inner := quoted[1 : len(quoted)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		// In place: a key of the body costs no allocation.
		return bytes.EqualFold(inner, []byte(name))
	}
	k, ok := unquoteKey(quoted)
	return ok && strings.EqualFold(k, name)
}

// unquoteKey decodes a quoted key that has escapes.
func unquoteKey(quoted []byte) (string, bool) {
	var s string
	return s, json.Unmarshal(quoted, &s) == nil
}

// plainString returns the value of a JSON string that decodes to its own
// bytes: no escapes, no control characters, valid UTF-8. For anything else
// ok is false and the caller decodes it with encoding/json, which then
// yields the same as it always would.
func plainString(v []byte) (s string, ok bool) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", false
	}
	inner := v[1 : len(v)-1]
	for _, c := range inner {
		if c < 0x20 || c == '\\' || c == '"' {
			return "", false
		}
	}
	if !utf8.Valid(inner) {
		return "", false
	}
	return string(inner), true
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at b[i]. It
// jumps from quote to quote (bytes.IndexByte is vectorised: a long text
// prompt is most of a body) and a quote ends the string when an even
// number of backslashes precedes it.
func skipString(b []byte, i int) (int, error) {
	if i >= len(b) || b[i] != '"' {
		return 0, errNotObject
	}
	for i++; ; i++ {
		j := bytes.IndexByte(b[i:], '"')
		if j < 0 {
			return 0, errNotObject
		}
		i += j
		// The opening quote stops this walk, so it stays in the string.
		n := 0
		for k := i - 1; b[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return i + 1, nil
		}
	}
}

// structural marks the bytes skipValue looks at inside an array or object;
// the rest (numbers, literals, commas, colons, white space: nearly all of a
// token-id prompt) is passed over in a tight loop.
var structural = [256]bool{'"': true, '[': true, ']': true, '{': true, '}': true}

// skipPlain returns the index of the first 8-byte word at or after b[i]
// that may hold a structural byte (or the end of the last whole word),
// testing a word at a time: a byte equals c where x^c has a zero byte, and
// OR-ing 0x20 folds '[' and ']' onto '{' and '}' (and nothing else onto
// them), so three zero-byte tests cover the five structural bytes.
func skipPlain(b []byte, i int) int {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	zero := func(y uint64) uint64 { return (y - ones) &^ y & highs }
	for ; i+8 <= len(b); i += 8 {
		x := binary.LittleEndian.Uint64(b[i:])
		f := x | 0x20*ones
		if zero(x^'"'*ones)|zero(f^'{'*ones)|zero(f^'}'*ones) != 0 {
			return i
		}
	}
	return i
}

// skipValue returns the index after the JSON value starting at b[i].
func skipValue(b []byte, i int) (int, error) {
	if i >= len(b) {
		return 0, errNotObject
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			i = skipPlain(b, i)
			if i >= len(b) {
				break
			}
			c := b[i]
			if !structural[c] {
				i++
				continue
			}
			switch c {
			case '"':
				e, err := skipString(b, i)
				if err != nil {
					return 0, err
				}
				i = e
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1, nil
				}
			}
			i++
		}
		return 0, errNotObject
	}
	// Number, true, false, null: up to the next delimiter.
	for ; i < len(b); i++ {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i, nil
		}
	}
	return i, nil
}
