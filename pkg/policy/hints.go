package policy

import (
	"strconv"
	"strings"

	"github.com/laneway-dev/laneway/pkg/podmetrics"
	"github.com/laneway-dev/laneway/pkg/tokenize"
)

// Hints are a request's scheduling hints (SPEC §6), merged from the JSON
// body (ApplyAgentHints) and the headers (HeaderHints).
type Hints struct {
	// Priority is the soft priority (higher = more important), raw: a
	// negative value is kept for forwarding to the engine; queue ordering
	// clamps it to 0 (pkg/drr does).
	Priority    int32
	HasPriority bool
	// StrictPriority is the router-only strict tier (higher always first).
	// It is never forwarded.
	StrictPriority uint32
	// OSL is the expected output length in tokens, when HasOSL.
	OSL    uint32
	HasOSL bool
	// SpeculativePrefill asks for a prefill of the next turn's prefix.
	SpeculativePrefill bool
	// Class is the class header's value (trimmed); "" when absent.
	Class string
}

// ApplyAgentHints sets the fields that the body's nvext.agent_hints
// carried (tokenize.Extract reads them in its one pass over the body,
// resolving the latency_sensitivity alias); absent ones stay as they are.
func (h *Hints) ApplyAgentHints(a tokenize.AgentHints) {
	if a.HasPriority {
		h.Priority, h.HasPriority = a.Priority, true
	}
	if a.HasStrictPriority {
		h.StrictPriority = a.StrictPriority
	}
	if a.HasOSL {
		h.OSL, h.HasOSL = a.OSL, true
	}
	if a.HasSpeculativePrefill {
		h.SpeculativePrefill = a.SpeculativePrefill
	}
}

// The hint headers. Laneway's own names take precedence over the Dynamo
// names when both are present and well-formed: they are what an operator
// sets deliberately for this picker (for instance at the gateway), while the
// Dynamo names come from clients written for the reference router.
const (
	HeaderDynamoPriority       = "x-dynamo-request-priority"
	HeaderDynamoStrictPriority = "x-dynamo-request-strict-priority"
	HeaderDynamoPolicyClass    = "x-dynamo-meta-policy-class"
	HeaderPriority             = "x-laneway-priority"
	HeaderStrictPriority       = "x-laneway-strict-priority"
	HeaderPolicyClass          = "x-laneway-policy-class"
)

// headerValue is the first value of one hint header.
type headerValue struct {
	seen bool // a non-empty value was observed; later ones are ignored
	ok   bool // that value was well-formed
	i    int64
	s    string
}

// HeaderHints collects the hint headers of one request, header by header,
// without allocating. Feed every request header to Observe, then call
// Apply. Per header name the first non-empty value wins (a value is
// trimmed, and only its part before the first comma counts, so a header
// repeated and folded as "a, b" reads as "a"); a malformed first value
// leaves that header ignored.
type HeaderHints struct {
	// [0] holds the Dynamo name, [1] Laneway's.
	priority, strict, class [2]headerValue
}

// Observe offers one header. Names compare case-insensitively. It reports
// whether the header is one of the hint headers.
func (hh *HeaderHints) Observe(name, value string) bool {
	var slot *headerValue
	var kind byte
	// Cheap rejection first: every hint header starts with "x-" and is
	// 18 to 32 bytes long; most request headers are not hint headers.
	if len(name) < len(HeaderPriority) || len(name) > len(HeaderDynamoStrictPriority) ||
		(name[0] != 'x' && name[0] != 'X') || name[1] != '-' {
		return false
	}
	switch {
	case strings.EqualFold(name, HeaderDynamoPriority):
		slot, kind = &hh.priority[0], 'p'
	case strings.EqualFold(name, HeaderPriority):
		slot, kind = &hh.priority[1], 'p'
	case strings.EqualFold(name, HeaderDynamoStrictPriority):
		slot, kind = &hh.strict[0], 's'
	case strings.EqualFold(name, HeaderStrictPriority):
		slot, kind = &hh.strict[1], 's'
	case strings.EqualFold(name, HeaderDynamoPolicyClass):
		slot, kind = &hh.class[0], 'c'
	case strings.EqualFold(name, HeaderPolicyClass):
		slot, kind = &hh.class[1], 'c'
	default:
		return false
	}
	if slot.seen {
		return true
	}
	if i := strings.IndexByte(value, ','); i >= 0 {
		value = value[:i]
	}
	value = strings.TrimSpace(value)
	if value == "" {
		return true
	}
	slot.seen = true
	switch kind {
	case 'p':
		v, err := strconv.ParseInt(value, 10, 32)
		slot.i, slot.ok = v, err == nil
	case 's':
		v, err := strconv.ParseUint(value, 10, 32)
		slot.i, slot.ok = int64(v), err == nil
	default:
		slot.s, slot.ok = value, true
	}
	return true
}

// pick returns the well-formed value with precedence: Laneway's, then
// Dynamo's.
func pick(v *[2]headerValue) (headerValue, bool) {
	if v[1].ok {
		return v[1], true
	}
	if v[0].ok {
		return v[0], true
	}
	return headerValue{}, false
}

// Apply overrides h's body-derived fields with the well-formed headers.
func (hh *HeaderHints) Apply(h *Hints) {
	if v, ok := pick(&hh.priority); ok {
		h.Priority, h.HasPriority = int32(v.i), true
	}
	if v, ok := pick(&hh.strict); ok {
		h.StrictPriority = uint32(v.i)
	}
	if v, ok := pick(&hh.class); ok {
		h.Class = v.s
	}
}

// Engine is a backend engine kind. It is podmetrics.Engine: one set of
// names serves --engine-type, the engine-type pod label, the metrics
// mapping (SPEC §9) and the polarity of the forwarded priority (SPEC §6).
type Engine = podmetrics.Engine

// The engines.
const (
	EngineVLLM   = podmetrics.EngineVLLM
	EngineSGLang = podmetrics.EngineSGLang
	EngineTRTLLM = podmetrics.EngineTRTLLM
)

// ParseEngine reads an engine name: vllm, sglang or trtllm.
func ParseEngine(s string) (Engine, error) { return podmetrics.ParseEngine(s) }

// ForwardPriority returns the value of the engine's per-request priority
// field for a Laneway soft priority p (higher = more important), and false
// when the engine takes none. vLLM's priority is lower-is-more-important,
// so it gets -p (an int64: -MinInt32 does not fit int32); SGLang's is
// higher-is-more-important and gets p as is; TensorRT-LLM exposes no
// per-request priority. strict_priority is never forwarded.
func ForwardPriority(e Engine, p int32) (int64, bool) {
	switch e {
	case EngineVLLM:
		return -int64(p), true
	case EngineSGLang:
		return int64(p), true
	}
	return 0, false
}
