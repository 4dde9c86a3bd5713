package extproc

import (
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// Names of the Gateway API Inference Extension protocol (EPP protocol v1,
// SPEC §7) and of Laneway's own additions. Gateway-side code (the local
// gateway, test clients) uses the same constants so both ends agree.
const (
	// HeaderDestinationEndpoint carries the pick, "ip:port[,ip:port...]", on
	// the request to the upstream; Envoy's ORIGINAL_DST cluster routes on it.
	HeaderDestinationEndpoint = "x-gateway-destination-endpoint"
	// MetadataNamespaceLB is the dynamic metadata namespace of the pick and of
	// the served endpoint.
	MetadataNamespaceLB = "envoy.lb"
	// MetadataKeyDestination is the key of the pick in MetadataNamespaceLB.
	MetadataKeyDestination = HeaderDestinationEndpoint
	// MetadataKeyServed is the key in MetadataNamespaceLB, on the response
	// path, naming the endpoint that actually served the request.
	MetadataKeyServed = "x-gateway-destination-endpoint-served"
	// MetadataNamespaceSubset is the filter metadata namespace of the subset
	// hint.
	MetadataNamespaceSubset = "envoy.lb.subset_hint"
	// MetadataKeySubset is the key of the subset hint: a list (or a comma
	// separated string) of "ip[:port]".
	MetadataKeySubset = "x-gateway-destination-endpoint-subset"
	// HeaderTestEndpointSelection is the conformance suite's request header
	// restricting candidates to "ip[:port],...".
	HeaderTestEndpointSelection = "test-epp-endpoint-selection"
	// HeaderConformanceServed is the response header echoing the served
	// endpoint to the conformance suite.
	HeaderConformanceServed = "x-conformance-test-served-endpoint"
	// HeaderReason names, in one machine word, why Laneway answered a request
	// itself (ImmediateResponse).
	HeaderReason = "x-laneway-reason"
	// HeaderRetryAfter is the standard HTTP header, in seconds, on every
	// 429 and 503 the picker answers itself.
	HeaderRetryAfter = "retry-after"
	// MaxChunkBytes bounds every body chunk the server streams back: Envoy
	// and the upstream EPP use this size so a chunk plus framing stays under
	// 64 KiB buffers.
	MaxChunkBytes = 62000
	// DefaultMaxBodyBytes is the default request body limit (16 MiB).
	DefaultMaxBodyBytes = 16 << 20
)

// DefaultMaxHeaderBytes is the default bound on a request's header block
// (Options.MaxHeaderBytes): 64 KiB, above Envoy's own default limit of 60
// KiB, so no request a default Envoy forwards is refused for it.
const DefaultMaxHeaderBytes = 64 << 10

// headerBytes is the size of a header block as the picker keeps it: each
// name and its value (raw_value, else value).
func headerBytes(hm *corev3.HeaderMap) int {
	n := 0
	for _, h := range hm.GetHeaders() {
		v := len(h.GetRawValue())
		if v == 0 {
			v = len(h.GetValue())
		}
		n += len(h.GetKey()) + v
	}
	return n
}

// headerMap flattens a HeaderMap: lower-cased names, first value wins, and
// a value is raw_value (what Envoy sends) or, when that is empty, value
// (older clients). The
// raw values are copied into one string that the map's values slice, so a
// request's headers cost one allocation besides the map's own.
func headerMap(hm *corev3.HeaderMap) map[string]string {
	hs := hm.GetHeaders()
	m := make(map[string]string, len(hs))
	n := 0
	for _, h := range hs {
		n += len(h.GetRawValue())
	}
	var sb strings.Builder
	sb.Grow(n)
	for _, h := range hs {
		sb.Write(h.GetRawValue())
	}
	raw := sb.String()
	for _, h := range hs {
		k := h.GetKey()
		if !isLower(k) {
			k = strings.ToLower(k)
		}
		v := h.GetValue()
		if rv := h.GetRawValue(); len(rv) > 0 {
			v, raw = raw[:len(rv)], raw[len(rv):]
		}
		if _, seen := m[k]; !seen {
			m[k] = v
		}
	}
	return m
}

// isLower reports whether s has no ASCII upper-case letter, so the common
// case (Envoy already lower-cases names) costs no allocation.
func isLower(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; 'A' <= c && c <= 'Z' {
			return false
		}
	}
	return true
}

// splitList splits a comma separated list, trims entries and drops empty ones.
// It appends to dst so list and string forms of a hint share one slice.
func splitList(dst []string, s string) []string {
	for part := range strings.SplitSeq(s, ",") {
		if p := strings.TrimSpace(part); p != "" {
			dst = append(dst, p)
		}
	}
	return dst
}

// subsetHint reads the subset hint from a request's metadata context. present
// is true when the key exists, even if it names nothing; the returned slice is
// then non-nil. Both the list form (control planes, test harnesses) and the
// comma string form (header-to-metadata filters) are accepted, and list entries
// may themselves be comma strings.
func subsetHint(md *corev3.Metadata) (subset []string, present bool) {
	ns, ok := md.GetFilterMetadata()[MetadataNamespaceSubset]
	if !ok {
		return nil, false
	}
	v, ok := ns.GetFields()[MetadataKeySubset]
	if !ok {
		return nil, false
	}
	subset = []string{}
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		subset = splitList(subset, k.StringValue)
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			subset = splitList(subset, e.GetStringValue())
		}
	}
	return subset, true
}

// servedEndpoint reads envoy.lb / x-gateway-destination-endpoint-served from
// response-path metadata; "" when absent.
func servedEndpoint(md *corev3.Metadata) string {
	ns, ok := md.GetFilterMetadata()[MetadataNamespaceLB]
	if !ok {
		return ""
	}
	return ns.GetFields()[MetadataKeyServed].GetStringValue()
}
