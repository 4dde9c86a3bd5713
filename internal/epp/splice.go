package epp

import (
	"strconv"

	"github.com/laneway-dev/laneway/pkg/tokenize"
)

// splicePriority returns a copy of body with exactly one top-level
// priority member, of the integer value v: the last of the body's own
// priority members keeps its place and gets the value (a decoder keeps
// the last of duplicates, so that is the one the client meant), the
// others are removed whole with their commas; a body without one gets
// "priority":v inserted as the first member. The result is thus at most
// the digits of v longer than body, however many members the client
// repeated. at says where those members are: the parser found them in its
// one pass over the body, so nothing is scanned here but the whitespace
// around a removed member. The rest of the body is copied byte for byte,
// not re-encoded, so numbers, key order and unknown fields reach the
// engine as the client sent them. ok is false when at does not fit body
// (a parser bug); the body then goes unchanged.
func splicePriority(body []byte, at *tokenize.PrioritySpans, v int64) (out []byte, ok bool) {
	if !spansFit(body, at) {
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
	last := len(at.Values) - 1
	out = make([]byte, 0, len(body)+len(val))
	pos := removeMembers(&out, body, at, last)
	out = append(out, body[pos:at.Values[last].Start]...)
	out = append(out, val...)
	return append(out, body[at.Values[last].End:]...), true
}

// dropPriority returns a copy of body without its top-level priority
// members, each removed whole with a comma, the rest byte for byte; nil
// when body has none (nothing to change). ok is false when at does not
// fit body.
func dropPriority(body []byte, at *tokenize.PrioritySpans) (out []byte, ok bool) {
	if !spansFit(body, at) {
		return nil, false
	}
	if len(at.Values) == 0 {
		return nil, true
	}
	out = make([]byte, 0, len(body))
	pos := removeMembers(&out, body, at, len(at.Values))
	return append(out, body[pos:]...), true
}

// spansFit reports whether at describes body: its object's '{', and the
// priority members in order, each key before its value, inside body.
func spansFit(body []byte, at *tokenize.PrioritySpans) bool {
	if at.Open < 0 || at.Open >= len(body) || body[at.Open] != '{' || len(at.Keys) != len(at.Values) {
		return false
	}
	prev := at.Open + 1
	for i, sp := range at.Values {
		if k := at.Keys[i]; k < prev || sp.Start <= k || sp.End < sp.Start || sp.End > len(body) {
			return false
		}
		prev = sp.End
	}
	return true
}

// removeMembers appends body to out up to the n-th priority member,
// leaving out the first n members whole: each with the comma after it, or,
// when it is the object's last member, with the comma before it. It
// returns the offset in body where copying goes on.
func removeMembers(out *[]byte, body []byte, at *tokenize.PrioritySpans, n int) int {
	pos := 0
	for i := range n {
		*out = append(*out, body[pos:at.Keys[i]]...)
		end := at.Values[i].End
		j := skipSpace(body, end)
		if j < len(body) && body[j] == ',' {
			pos = j + 1
			continue
		}
		// The object's last member: the comma before it (copied already,
		// or left by a member removed before) goes instead.
		if c := lastNonSpace(*out); c >= 0 && (*out)[c] == ',' {
			*out = append((*out)[:c], (*out)[c+1:]...)
		}
		pos = end
	}
	return pos
}

// skipSpace returns the offset of the first byte at or after i that is
// not JSON whitespace.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// lastNonSpace returns the offset of the last byte of b that is not JSON
// whitespace, or -1.
func lastNonSpace(b []byte) int {
	i := len(b) - 1
	for i >= 0 && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i--
	}
	return i
}
