package epp

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
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
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return nil, errNotObject
	}
	open := i
	// Value spans [start, end) of members named key.
	var spans [][2]int
	i = skipSpace(body, i+1)
	if i < len(body) && body[i] == '}' {
		i = len(body) // empty object: nothing to scan
	}
	for i < len(body) {
		ks := i
		ke, err := skipString(body, i)
		if err != nil {
			return nil, err
		}
		i = skipSpace(body, ke)
		if i >= len(body) || body[i] != ':' {
			return nil, errNotObject
		}
		vs := skipSpace(body, i+1)
		ve, err := skipValue(body, vs)
		if err != nil {
			return nil, err
		}
		if keyEquals(body[ks:ke], key) {
			spans = append(spans, [2]int{vs, ve})
		}
		i = skipSpace(body, ve)
		if i < len(body) && body[i] == ',' {
			i = skipSpace(body, i+1)
			continue
		}
		break
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

// keyEquals compares a quoted JSON key with name, decoding escapes only
// when the key has any.
func keyEquals(quoted []byte, name string) bool {
	inner := quoted[1 : len(quoted)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		return string(inner) == name
	}
	var s string
	return json.Unmarshal(quoted, &s) == nil && s == name
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at b[i].
func skipString(b []byte, i int) (int, error) {
	if i >= len(b) || b[i] != '"' {
		return 0, errNotObject
	}
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1, nil
		}
	}
	return 0, errNotObject
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
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				e, err := skipString(b, i)
				if err != nil {
					return 0, err
				}
				i = e - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1, nil
				}
			}
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
