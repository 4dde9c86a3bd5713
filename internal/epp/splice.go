package epp

import (
	"strconv"

	"github.com/laneway-dev/laneway/pkg/tokenize"
)

// splicePriority returns a copy of body whose top-level priority members
// all have the integer value v (a decoder keeps the last of duplicates, so
// every one is set), or, when there is none, with "priority":v inserted as
// the first member. at says where those members are: the parser found them
// in its one pass over the body, so nothing is scanned here. The rest of
// the body is copied byte for byte, not re-encoded, so numbers, key order
// and unknown fields reach the engine as the client sent them. ok is false
// when at does not fit body (a parser bug); the body then goes unchanged.
func splicePriority(body []byte, at *tokenize.PrioritySpans, v int64) (out []byte, ok bool) {
	if at.Open < 0 || at.Open >= len(body) || body[at.Open] != '{' {
		return nil, false
	}
	var num [24]byte
	val := strconv.AppendInt(num[:0], v, 10)
	if len(at.Values) == 0 {
		const member = `"priority":`
		out = make([]byte, 0, len(body)+len(member)+len(val)+1)
		out = append(out, body[:at.Open+1]...)
		out = append(out, member...)
		out = append(out, val...)
		if !at.Empty {
			out = append(out, ',')
		}
		return append(out, body[at.Open+1:]...), true
	}
	out = make([]byte, 0, len(body)+len(at.Values)*len(val))
	prev := at.Open
	for _, sp := range at.Values {
		if sp.Start < prev || sp.End < sp.Start || sp.End > len(body) {
			return nil, false
		}
		out = append(out, body[prev:sp.Start]...)
		out = append(out, val...)
		prev = sp.End
	}
	return append(out, body[prev:]...), true
}
