package extproc

import (
	"context"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// Request is what the gateway told us about one HTTP request.
type Request struct {
	// Headers holds the request headers with lower-cased names, including the
	// HTTP/2 pseudo headers (:method, :path, :authority); the first value of a
	// repeated header wins and values are kept as received.
	Headers map[string]string
	// Body is the whole request body; it may be empty.
	Body []byte
	// Subset is the endpoint subset hint from filter metadata
	// envoy.lb.subset_hint / x-gateway-destination-endpoint-subset as a list of
	// "ip[:port]"; nil means there was no hint.
	Subset []string
	// HasSubset reports that the hint key was present, even when it named no
	// endpoint (which SPEC §7 answers with 503).
	HasSubset bool
	// TestEndpoints is the conformance header test-epp-endpoint-selection split
	// on commas; nil means the header was absent or empty, or the server
	// does not honour it (Options.ConformanceHooks).
	TestEndpoints []string
	// Metadata is the metadata_context the gateway forwarded with the
	// request headers (its forwarding namespaces; nil when none). It is
	// where a JWT filter's claims arrive (MetadataString).
	Metadata *corev3.Metadata
}

// MetadataString returns the string at path inside the forwarded filter
// metadata namespace ns (each key but the last names a nested struct), and
// whether there is one. A number is not a string: identities are strings.
func (r *Request) MetadataString(ns string, path []string) (string, bool) {
	st := r.Metadata.GetFilterMetadata()[ns]
	if st == nil || len(path) == 0 {
		return "", false
	}
	for _, k := range path[:len(path)-1] {
		if st = st.GetFields()[k].GetStructValue(); st == nil {
			return "", false
		}
	}
	v, ok := st.GetFields()[path[len(path)-1]].GetKind().(*structpb.Value_StringValue)
	if !ok {
		return "", false
	}
	return v.StringValue, true
}

// Decision is the decider's answer for a routable request.
type Decision struct {
	// Endpoints lists "ip:port" targets: the first is the pick, the rest are
	// ordered fallbacks. It must not be empty.
	Endpoints []string
	// Body replaces the request body when non-nil; nil forwards the body
	// unchanged. The server fixes content-length itself.
	Body []byte
	// Lifecycle receives the response-path events of the dispatched request;
	// it may be nil.
	Lifecycle Lifecycle
	// Headers are request headers to set on the request the gateway sends
	// upstream, overwriting any value the client sent (for example the
	// prefill pod of a disaggregated request, x-prefiller-host-port).
	Headers []Header
	// RemoveHeaders are request headers the gateway must strip from the
	// request it sends upstream (a client's own x-prefiller-host-port).
	RemoveHeaders []string
}

// Header is one request header a Decision sets.
type Header struct {
	Name, Value string
}

// Lifecycle receives the response-path events of a dispatched request.
type Lifecycle interface {
	// FirstByte reports the first response body byte (or the end of a response
	// without a body). It is called at most once.
	FirstByte()
	// Done reports that the stream ended for any reason. It is called exactly
	// once per dispatched request, after FirstByte if that happened.
	Done()
}

// Decider decides where a request goes. It may block (the request is queued)
// until ctx ends; ctx ends when the gateway abandons the stream.
type Decider interface {
	Decide(ctx context.Context, req *Request) (Decision, error)
}

// Reply is an error a Decider returns to answer the client directly with an
// ImmediateResponse.
type Reply struct {
	// Status is the HTTP status (400, 429, 503...).
	Status int
	// Reason is a short machine word sent as header x-laneway-reason (for
	// example "queue_limit", "shed", "no_endpoints", "shutting_down",
	// "malformed_body").
	Reason string
	// Body is the JSON response body; when nil, {"error": Message} is sent.
	Body []byte
	// Message is the human-readable error text.
	Message string
	// RetryAfter is the retry-after header of a 429 or 503 (rounded up to
	// whole seconds, at least one); 0 sends the server's
	// Options.RetryAfter. Other statuses carry none.
	RetryAfter time.Duration
}

// Error returns the reply's message, prefixed with its status and reason so
// that a Reply logged as an error says what the client was told.
func (r *Reply) Error() string {
	return "reply " + strconv.Itoa(r.Status) + " " + r.Reason + ": " + r.Message
}
