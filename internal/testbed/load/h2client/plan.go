package h2client

import (
	"encoding/binary"
	"fmt"
	"net/http"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
)

// DefaultChunkBytes is the largest request or response body message a Plan
// sends, as Envoy splits bodies by its buffer size.
const DefaultChunkBytes = 62_000

// Exchange describes the HTTP request every stream of a run plays and the
// upstream response it plays back after the hold.
type Exchange struct {
	// Path is the request path; "/" when empty.
	Path string
	// Headers are the request headers (":" pseudo-headers are added).
	Headers http.Header
	// Body is the request body.
	Body []byte
	// ResponseStatus and ResponseHeaders are the upstream's answer;
	// ResponseBody its body, sent as one chunk.
	ResponseStatus  int
	ResponseHeaders http.Header
	ResponseBody    []byte
	// ChunkBytes bounds one body message; 0 means DefaultChunkBytes.
	ChunkBytes int
	// HeaderOnly plays a gateway that sends no response phase (Envoy with
	// response_header_mode SKIP and response_body_mode NONE): the stream
	// is half-closed with the request's last message and is over when
	// the picker ends it after its answer. The Response fields and the
	// connection's Hold are then unused.
	HeaderOnly bool
}

// Plan is an Exchange encoded once as length-prefixed gRPC messages, ready
// to be shared read-only by every stream.
type Plan struct {
	// request is the request phase: headers and every body message.
	request []byte
	// response is the response headers message followed by the body
	// messages; respBodyMsgs counts the latter.
	response     []byte
	respBodyMsgs int
	// headerOnly: END_STREAM goes with the request, no response follows.
	headerOnly bool
}

// NewPlan encodes ex in FULL_DUPLEX_STREAMED shape (the response body
// mode NONE when HeaderOnly).
func NewPlan(ex Exchange) (*Plan, error) {
	chunk := ex.ChunkBytes
	if chunk <= 0 {
		chunk = DefaultChunkBytes
	}
	path := ex.Path
	if path == "" {
		path = "/"
	}
	hs := []*corev3.HeaderValue{
		{Key: ":authority", RawValue: []byte("localhost")},
		{Key: ":path", RawValue: []byte(path)},
		{Key: ":method", RawValue: []byte(http.MethodPost)},
		{Key: ":scheme", RawValue: []byte("http")},
	}
	hs = extprocclient.AppendHeaders(hs, ex.Headers)
	if len(ex.Body) > 0 && ex.Headers.Get("content-length") == "" {
		hs = append(hs, &corev3.HeaderValue{Key: "content-length", RawValue: []byte(strconv.Itoa(len(ex.Body)))})
	}
	mode, respMode := filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	if ex.HeaderOnly {
		respMode = filterv3.ProcessingMode_NONE
	}
	p := &Plan{headerOnly: ex.HeaderOnly}
	var err error
	p.request, err = appendMessage(nil, &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: hs}, EndOfStream: len(ex.Body) == 0,
		}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: mode, ResponseBodyMode: respMode},
	})
	if err != nil {
		return nil, err
	}
	for off := 0; off < len(ex.Body); off += chunk {
		end := min(off+chunk, len(ex.Body))
		p.request, err = appendMessage(p.request, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: ex.Body[off:end], EndOfStream: end == len(ex.Body)},
		}})
		if err != nil {
			return nil, err
		}
	}
	if ex.HeaderOnly {
		return p, nil
	}
	status := ex.ResponseStatus
	if status == 0 {
		status = http.StatusOK
	}
	rh := extprocclient.AppendHeaders([]*corev3.HeaderValue{{Key: ":status", RawValue: []byte(strconv.Itoa(status))}}, ex.ResponseHeaders)
	p.response, err = appendMessage(nil, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: rh}},
	}})
	if err != nil {
		return nil, err
	}
	// One body message at least: the end of the response must reach the
	// picker, which releases the request's accounting there.
	for off := 0; ; off += chunk {
		end := min(off+chunk, len(ex.ResponseBody))
		p.response, err = appendMessage(p.response, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
			ResponseBody: &extprocv3.HttpBody{Body: ex.ResponseBody[off:end], EndOfStream: end == len(ex.ResponseBody)},
		}})
		if err != nil {
			return nil, err
		}
		p.respBodyMsgs++
		if end == len(ex.ResponseBody) {
			break
		}
	}
	return p, nil
}

// appendMessage appends m with its gRPC length prefix (uncompressed).
func appendMessage(dst []byte, m proto.Message) ([]byte, error) {
	b, err := proto.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode %T: %w", m, err)
	}
	dst = append(dst, 0, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(dst[len(dst)-4:], uint32(len(b)))
	return append(dst, b...), nil
}
