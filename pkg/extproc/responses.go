package extproc

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// setHeader is a header mutation that replaces any value the client sent:
// the default append action would let a client smuggle in its own
// x-gateway-destination-endpoint next to ours.
func setHeader(key, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: key, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// pickResponse builds the answer that carries the pick: the destination
// header (overwritten), the endpoint list in dynamic metadata envoy.lb, and
// clear_route_cache so the route is re-evaluated with the new header. newLen
// >= 0 sets content-length to the replaced body's length; in BUFFERED mode
// (onBody) replace, when non-nil, becomes the body mutation.
//
// content-length: in FULL_DUPLEX_STREAMED mode Envoy drops content-length by
// itself when it cannot trust it, and otherwise forwards what we set; either
// way setting the exact length of the body we stream back is correct, and it
// spares HTTP/1.1 model servers a chunked request body. In BUFFERED mode
// Envoy requires the processor to set it and rejects a mismatch.
func pickResponse(header, list string, newLen int, replace []byte, onBody bool) *extprocv3.ProcessingResponse {
	// One allocation holds every message but the two metadata maps.
	m := &pickMsg{}
	m.vals[0] = corev3.HeaderValue{Key: HeaderDestinationEndpoint, RawValue: []byte(header)}
	m.opts[0] = corev3.HeaderValueOption{Header: &m.vals[0], AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
	m.set[0] = &m.opts[0]
	n := 1
	if newLen >= 0 {
		m.vals[1] = corev3.HeaderValue{Key: "content-length", RawValue: strconv.AppendInt(nil, int64(newLen), 10)}
		m.opts[1] = corev3.HeaderValueOption{Header: &m.vals[1], AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
		m.set[1] = &m.opts[1]
		n = 2
	}
	m.mut.SetHeaders = m.set[:n:n]
	m.common.ClearRouteCache = true
	m.common.HeaderMutation = &m.mut
	if onBody && replace != nil {
		m.bmBody.Body = replace
		m.bm.Mutation = &m.bmBody
		m.common.BodyMutation = &m.bm
	}
	m.dstKind.StringValue = list
	m.dst.Kind = &m.dstKind
	m.lb.Fields = map[string]*structpb.Value{MetadataKeyDestination: &m.dst}
	m.lbKind.StructValue = &m.lb
	m.lbVal.Kind = &m.lbKind
	m.md.Fields = map[string]*structpb.Value{MetadataNamespaceLB: &m.lbVal}
	m.resp.DynamicMetadata = &m.md
	if onBody {
		m.body.Response = &m.common
		m.onBody.RequestBody = &m.body
		m.resp.Response = &m.onBody
	} else {
		m.hdrs.Response = &m.common
		m.onHdr.RequestHeaders = &m.hdrs
		m.resp.Response = &m.onHdr
	}
	return &m.resp
}

// addHeaders adds a Decision's own request header changes to a pick
// answer built by pickResponse: each set overwrites what the client sent,
// and removals are listed as such.
func addHeaders(resp *extprocv3.ProcessingResponse, set []Header, remove []string) {
	if len(set) == 0 && len(remove) == 0 {
		return
	}
	var hm *extprocv3.HeaderMutation
	switch r := resp.Response.(type) {
	case *extprocv3.ProcessingResponse_RequestHeaders:
		hm = r.RequestHeaders.GetResponse().GetHeaderMutation()
	case *extprocv3.ProcessingResponse_RequestBody:
		hm = r.RequestBody.GetResponse().GetHeaderMutation()
	}
	if hm == nil {
		return // not a pick answer: nothing to add to
	}
	for _, h := range set {
		hm.SetHeaders = append(hm.SetHeaders, setHeader(h.Name, h.Value))
	}
	hm.RemoveHeaders = append(hm.RemoveHeaders, remove...)
}

// pickMsg holds the messages of one pick answer.
type pickMsg struct {
	resp    extprocv3.ProcessingResponse
	onHdr   extprocv3.ProcessingResponse_RequestHeaders
	onBody  extprocv3.ProcessingResponse_RequestBody
	hdrs    extprocv3.HeadersResponse
	body    extprocv3.BodyResponse
	common  extprocv3.CommonResponse
	mut     extprocv3.HeaderMutation
	set     [2]*corev3.HeaderValueOption
	opts    [2]corev3.HeaderValueOption
	vals    [2]corev3.HeaderValue
	bm      extprocv3.BodyMutation
	bmBody  extprocv3.BodyMutation_Body
	md      structpb.Struct
	lbVal   structpb.Value
	lbKind  structpb.Value_StructValue
	lb      structpb.Struct
	dst     structpb.Value
	dstKind structpb.Value_StringValue
}

// streamedBodyMsg holds every message of one streamed body answer, so the
// answer costs one allocation instead of seven; the chunk is the only part
// that differs between answers.
type streamedBodyMsg struct {
	resp   extprocv3.ProcessingResponse
	reqB   extprocv3.ProcessingResponse_RequestBody
	respB  extprocv3.ProcessingResponse_ResponseBody
	body   extprocv3.BodyResponse
	common extprocv3.CommonResponse
	mut    extprocv3.BodyMutation
	sr     extprocv3.BodyMutation_StreamedResponse
	sbr    extprocv3.StreamedBodyResponse
}

// streamedBody builds one FULL_DUPLEX_STREAMED body chunk answer.
func streamedBody(chunk []byte, eos, request bool) *extprocv3.ProcessingResponse {
	m := &streamedBodyMsg{}
	m.sbr.Body, m.sbr.EndOfStream = chunk, eos
	m.sr.StreamedResponse = &m.sbr
	m.mut.Mutation = &m.sr
	m.common.BodyMutation = &m.mut
	m.body.Response = &m.common
	if request {
		m.reqB.RequestBody = &m.body
		m.resp.Response = &m.reqB
	} else {
		m.respB.ResponseBody = &m.body
		m.resp.Response = &m.respB
	}
	return &m.resp
}

// Answers that never vary. gRPC only reads a message it sends (protobuf
// keeps its size cache with atomic operations, so concurrent marshalling
// of one message is safe), which lets every stream share them instead of
// allocating its own.
var (
	emptyRequestHeaders = &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}},
	}
	emptyRequestTrailers = &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}},
	}
	emptyResponseHeaders = &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}},
	}
	emptyResponseBody = &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}},
	}
	emptyResponseTrailers = &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}},
	}
)

// responseHeadersResponse answers response headers, echoing the served
// endpoint for the conformance suite when served is not empty.
func responseHeadersResponse(served string) *extprocv3.ProcessingResponse {
	if served == "" {
		return emptyResponseHeaders
	}
	hr := &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
		SetHeaders: []*corev3.HeaderValueOption{setHeader(HeaderConformanceServed, served)},
	}}}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: hr}}
}

// errorBody is the JSON body of a generated error answer.
type errorBody struct {
	Error string `json:"error"`
}

// immediateResponse answers the client directly. Envoy accepts only status
// codes its StatusCode enum defines, so anything else becomes 503. The
// details string (access log %RESPONSE_CODE_DETAILS%) must not contain
// spaces, hence the reason word. A 429 or 503 carries retry-after:
// retryAfter in whole seconds, rounded up, at least one (HTTP's
// delay-seconds has no fractions, and 0 would invite an instant retry).
func immediateResponse(code int, reason string, body []byte, message string, retryAfter time.Duration) *extprocv3.ProcessingResponse {
	if _, ok := typev3.StatusCode_name[int32(code)]; !ok || code < 200 {
		code = http.StatusServiceUnavailable
	}
	if body == nil {
		if message == "" {
			message = http.StatusText(code)
		}
		// Marshalling a struct of one string cannot fail.
		body, _ = json.Marshal(errorBody{Error: message})
	}
	set := []*corev3.HeaderValueOption{setHeader("content-type", "application/json")}
	details := "laneway"
	if reason != "" {
		set = append(set, setHeader(HeaderReason, reason))
		details += "_" + reason
	}
	if code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable {
		secs := max(1, int64((retryAfter+time.Second-1)/time.Second))
		set = append(set, setHeader(HeaderRetryAfter, strconv.FormatInt(secs, 10)))
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(code)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: set},
			Body:    body,
			Details: details,
		},
	}}
}
