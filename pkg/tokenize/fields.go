package tokenize

import (
	"errors"
	"fmt"
	"math"
	"unicode/utf8"
)

// ErrFieldType means a field Extract reads besides the prompt (model,
// nvext.agent_hints.*) has a type or range its reader does not accept, for
// example a priority of 1.5 or above 2^31-1. The error names the field.
var ErrFieldType = errors.New("field of the wrong type")

// Fields is what the endpoint picker reads from a request body besides its
// prompt (SPEC §6): the model, the agent hints, and where a forwarded
// priority goes.
type Fields struct {
	// Model is the top-level "model" string; "" when absent or null.
	Model string
	// Hints are the members of nvext.agent_hints.
	Hints AgentHints
	// Priority locates the top-level "priority" members, so a priority can
	// be forwarded to the engine without reading the body again.
	Priority PrioritySpans
	// MaxTokens is the top-level max_completion_tokens or, without it,
	// max_tokens, when HasMaxTokens: the most tokens the request may
	// generate. Only a whole number in [0, 2^32-1] counts; any other
	// value (a fraction, a string) is left to the engine to refuse and
	// reads as absent, so the picker never refuses a body for it.
	MaxTokens    uint32
	HasMaxTokens bool
}

// AgentHints are the scheduling hints of nvext.agent_hints (SPEC §6), read
// as encoding/json reads them into pointer fields: a member that is absent
// or null leaves its Has flag false, the last of duplicate members wins, and
// an nvext or agent_hints that is null drops what an earlier duplicate set.
type AgentHints struct {
	// Priority is priority (int32, higher = more important) or, when that
	// is absent, its deprecated alias latency_sensitivity.
	Priority    int32
	HasPriority bool
	// StrictPriority is strict_priority (uint32 tier).
	StrictPriority    uint32
	HasStrictPriority bool
	// OSL is osl (uint32), the expected output length in tokens.
	OSL    uint32
	HasOSL bool
	// SpeculativePrefill is speculative_prefill.
	SpeculativePrefill    bool
	HasSpeculativePrefill bool
}

// PrioritySpans says where the top-level "priority" members of a body are.
type PrioritySpans struct {
	// Open is the offset of the top-level object's '{'.
	Open int
	// Empty reports that the object has no members.
	Empty bool
	// Values are the byte ranges of the values of the top-level members
	// whose key is exactly "priority", in body order. Extract appends to
	// Values[:0], so a Fields reused across bodies keeps its capacity.
	Values []Span
	// Keys are the offsets of those members' keys (their opening quote),
	// parallel to Values: with them a member can be removed whole.
	Keys []int
}

// Span is the byte range [Start, End) of a body.
type Span struct{ Start, End int }

// reset clears f for a new body, keeping the capacity of Priority.Values
// and Priority.Keys.
func (f *Fields) reset() {
	*f = Fields{Priority: PrioritySpans{Values: f.Priority.Values[:0], Keys: f.Priority.Keys[:0]}}
}

// Bits of hintState.set.
const (
	hintPriority = 1 << iota
	hintLatency
	hintStrict
	hintOSL
	hintSpeculative
)

// hintState is nvext.agent_hints as read so far, a bit in set per member
// that holds a value (a pointer field that is not nil, in encoding/json's
// terms).
type hintState struct {
	set               uint8
	priority, latency int32
	strict, osl       uint32
	speculative       bool
}

// resolve applies the alias rule: latency_sensitivity counts only without
// priority.
func (h *hintState) resolve() AgentHints {
	var a AgentHints
	switch {
	case h.set&hintPriority != 0:
		a.Priority, a.HasPriority = h.priority, true
	case h.set&hintLatency != 0:
		a.Priority, a.HasPriority = h.latency, true
	}
	a.StrictPriority, a.HasStrictPriority = h.strict, h.set&hintStrict != 0
	a.OSL, a.HasOSL = h.osl, h.set&hintOSL != 0
	a.SpeculativePrefill, a.HasSpeculativePrefill = h.speculative, h.set&hintSpeculative != 0
	return a
}

// field reads the value of a top-level member other than the prompt.
func (e *extractor) field(key []byte) error {
	switch string(key) {
	case "model":
		return e.model()
	case "nvext":
		return e.object("nvext", func(key []byte) error {
			if string(key) == "agent_hints" {
				return e.object("nvext.agent_hints", e.agentHint, func() { e.hints.set = 0 })
			}
			return e.skipValue()
		}, func() { e.hints.set = 0 })
	case "max_tokens", "max_completion_tokens":
		v, ok, err := e.lenientCount()
		bit := uint8(outMaxTokens)
		if string(key) == "max_completion_tokens" {
			bit = outMaxCompletion
		}
		if ok {
			e.out.set |= bit
			e.out.v[bit>>1] = v
		} else {
			e.out.set &^= bit
		}
		return err
	case "priority":
		e.skipWS()
		start := e.i
		if err := e.skipValue(); err != nil {
			return err
		}
		e.f.Priority.Values = append(e.f.Priority.Values, Span{start, e.i})
		e.f.Priority.Keys = append(e.f.Priority.Keys, e.keyAt)
		return nil
	}
	return e.skipValue()
}

// model reads the model name: a string (null keeps an earlier one).
func (e *extractor) model() error {
	switch e.peek() {
	case 'n':
		return e.literal("null")
	case '"':
		e.i++
		s, err := e.readString(nil)
		if err != nil {
			return err
		}
		e.f.Model = validString(s)
		return nil
	}
	return e.wrongType("model", "string")
}

// object reads an object (after the member's key) and calls member with
// each of its keys, the value next; null calls null instead.
func (e *extractor) object(field string, member func(key []byte) error, null func()) error {
	switch e.peek() {
	case 'n':
		if err := e.literal("null"); err != nil {
			return err
		}
		null()
		return nil
	case '{':
		e.i++
		return e.members(member)
	}
	return e.wrongType(field, "object")
}

// agentHint reads one member of nvext.agent_hints.
func (e *extractor) agentHint(key []byte) error {
	h := &e.hints
	switch string(key) {
	case "priority":
		return readHint(e, "nvext.agent_hints.priority", hintPriority, &h.priority)
	case "latency_sensitivity":
		return readHint(e, "nvext.agent_hints.latency_sensitivity", hintLatency, &h.latency)
	case "strict_priority":
		return readHint(e, "nvext.agent_hints.strict_priority", hintStrict, &h.strict)
	case "osl":
		return readHint(e, "nvext.agent_hints.osl", hintOSL, &h.osl)
	case "speculative_prefill":
		switch e.peek() {
		case 'n':
			h.set &^= hintSpeculative
			return e.literal("null")
		case 't':
			h.set |= hintSpeculative
			h.speculative = true
			return e.literal("true")
		case 'f':
			h.set |= hintSpeculative
			h.speculative = false
			return e.literal("false")
		}
		return e.wrongType("nvext.agent_hints.speculative_prefill", "bool")
	}
	return e.skipValue()
}

// Bits of outState.set; each bit >> 1 is its index in outState.v.
const (
	outMaxTokens     = 1
	outMaxCompletion = 2
)

// outState holds the top-level max_tokens ([0]) and max_completion_tokens
// ([1]) read so far.
type outState struct {
	set uint8
	v   [2]uint32
}

// resolve puts the output bound in f: max_completion_tokens wins.
func (o *outState) resolve(f *Fields) {
	switch {
	case o.set&outMaxCompletion != 0:
		f.MaxTokens, f.HasMaxTokens = o.v[1], true
	case o.set&outMaxTokens != 0:
		f.MaxTokens, f.HasMaxTokens = o.v[0], true
	}
}

// lenientCount reads any JSON value and reports it as a count when it is a
// plain whole number in [0, 2^32-1]; any other value is skipped and reads
// as absent (ok false). Only a malformed body is an error.
func (e *extractor) lenientCount() (uint32, bool, error) {
	e.skipWS()
	start := e.i
	if err := e.skipValue(); err != nil {
		return 0, false, err
	}
	lit := e.b[start:e.i]
	if len(lit) == 0 || len(lit) > 10 {
		return 0, false, nil
	}
	var v uint64
	for _, c := range lit {
		if c < '0' || c > '9' {
			return 0, false, nil
		}
		v = v*10 + uint64(c-'0')
	}
	if v > math.MaxUint32 {
		return 0, false, nil
	}
	return uint32(v), true, nil
}

// readHint reads an integer hint of type T (int32 or uint32) or null into
// the extractor's hints: a value sets bit and *dst, null clears bit. The
// range and the type named in a wrong-type error follow T.
func readHint[T int32 | uint32](e *extractor, field string, bit uint8, dst *T) error {
	want, lo, hi := "int32", int64(math.MinInt32), int64(math.MaxInt32)
	if ^T(0) > 0 { // unsigned
		want, lo, hi = "uint32", 0, math.MaxUint32
	}
	v, ok, err := e.integer(field, want, lo, hi)
	if ok {
		*dst = T(v)
		e.hints.set |= bit
	} else {
		e.hints.set &^= bit
	}
	return err
}

// integer reads a JSON integer in [lo, hi] (ok) or null (!ok), as
// encoding/json reads one into a Go integer type named want: no fraction,
// no exponent, no minus sign for an unsigned type (not even on 0).
func (e *extractor) integer(field, want string, lo, hi int64) (int64, bool, error) {
	switch c := e.peek(); {
	case c == 'n':
		return 0, false, e.literal("null")
	case c != '-' && (c < '0' || c > '9'):
		return 0, false, e.wrongType(field, want)
	}
	start := e.i
	if err := e.number(); err != nil {
		return 0, false, err
	}
	digits := e.b[start:e.i]
	neg := digits[0] == '-'
	if neg {
		digits = digits[1:]
	}
	var v int64
	fits := !neg || lo < 0
	for _, c := range digits {
		if c < '0' || c > '9' || v > 1<<40 {
			fits = false // a fraction, an exponent, or far out of range
			break
		}
		v = v*10 + int64(c-'0')
	}
	if neg {
		v = -v
	}
	if !fits || v < lo || v > hi {
		e.i = start
		return 0, false, e.wrongType(field, want)
	}
	return v, true, nil
}

// maxQuotedNumber bounds the number literal an error quotes: a number is
// not user text, but a megabyte of digits should not become an error.
const maxQuotedNumber = 24

// wrongType reports the value at e.i as not fitting field's type want,
// naming its JSON kind (and a number's literal), as encoding/json's
// UnmarshalTypeError does.
func (e *extractor) wrongType(field, want string) error {
	at := e.i
	var kind string
	switch c := e.peek(); c {
	case '"':
		kind = "string"
	case '{':
		kind = "object"
	case '[':
		kind = "array"
	case 't', 'f':
		kind = "bool"
	default:
		kind = "number"
		start := e.i
		if err := e.number(); err != nil {
			return err
		}
		if lit := e.b[start:e.i]; len(lit) <= maxQuotedNumber {
			kind = "number " + string(lit)
		}
	}
	if want == "object" {
		want = "an object"
	}
	return fmt.Errorf("request body byte %d: field %s: %s does not fit %s: %w", at, field, kind, want, ErrFieldType)
}

// validString converts a decoded JSON string to a Go string as
// encoding/json does: each byte that is not part of valid UTF-8 becomes
// U+FFFD.
func validString(s []byte) string {
	if utf8.Valid(s) {
		return string(s)
	}
	out := make([]byte, 0, len(s)+8)
	for len(s) > 0 {
		r, n := utf8.DecodeRune(s)
		out = utf8.AppendRune(out, r) // an invalid byte decodes to RuneError, size 1
		s = s[n:]
	}
	return string(out)
}
