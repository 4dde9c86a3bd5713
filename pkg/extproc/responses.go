package extproc

import (
	"encoding/json"
	"net/http"
	"strconv"

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
	set := make([]*corev3.HeaderValueOption, 1, 2)
	set[0] = setHeader(HeaderDestinationEndpoint, header)
	if newLen >= 0 {
		set = append(set, setHeader("content-length", strconv.Itoa(newLen)))
	}
	common := &extprocv3.CommonResponse{
		ClearRouteCache: true,
		HeaderMutation:  &extprocv3.HeaderMutation{SetHeaders: set},
	}
	if onBody && replace != nil {
		common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: replace}}
	}
	resp := &extprocv3.ProcessingResponse{
		DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			MetadataNamespaceLB: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				MetadataKeyDestination: structpb.NewStringValue(list),
			}}),
		}},
	}
	if onBody {
		resp.Response = &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: common}}
	} else {
		resp.Response = &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common}}
	}
	return resp
}

// streamedBody builds one FULL_DUPLEX_STREAMED body chunk answer.
func streamedBody(chunk []byte, eos, request bool) *extprocv3.ProcessingResponse {
	common := &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
		Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
			Body: chunk, EndOfStream: eos,
		}},
	}}
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
			RequestBody: &extprocv3.BodyResponse{Response: common},
		}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
		ResponseBody: &extprocv3.BodyResponse{Response: common},
	}}
}

// responseHeadersResponse answers response headers, echoing the served
// endpoint for the conformance suite when served is not empty.
func responseHeadersResponse(served string) *extprocv3.ProcessingResponse {
	hr := &extprocv3.HeadersResponse{}
	if served != "" {
		hr.Response = &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
			SetHeaders: []*corev3.HeaderValueOption{setHeader(HeaderConformanceServed, served)},
		}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: hr}}
}

// errorBody is the JSON body of a generated error answer.
type errorBody struct {
	Error string `json:"error"`
}

// immediateResponse answers the client directly. Envoy accepts only status
// codes its StatusCode enum defines, so anything else becomes 503. The
// details string (access log %RESPONSE_CODE_DETAILS%) must not contain
// spaces, hence the reason word.
func immediateResponse(code int, reason string, body []byte, message string) *extprocv3.ProcessingResponse {
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
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(code)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: set},
			Body:    body,
			Details: details,
		},
	}}
}
