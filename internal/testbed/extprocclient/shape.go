package extprocclient

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/laneway-dev/laneway/pkg/extproc"
)

// Shape is the gateway a Client plays: which messages a stream carries
// and whether the response phases follow the request's. Not every gateway
// sends response phases; a picker learns nothing from such a gateway
// after its answer, and its suites must be able to show what that does.
type Shape uint8

const (
	// Envoy is Envoy's ext_proc filter with every phase sent (the zero
	// value): pseudo headers first, values in raw_value, protocol_config
	// in the first message, the body in chunks (Options.Mode), then the
	// response phases the caller plays, and an orderly end at Close.
	Envoy Shape = iota
	// EnvoySkip is Envoy configured with response_header_mode SKIP and
	// response_body_mode NONE: the request phase as Envoy sends it (with
	// NONE as the response body mode in protocol_config), then the
	// gateway half-closes the stream after the request's last message and
	// reads it until the picker ends it. No response phase is sent. The
	// streams share the Client's connection.
	EnvoySkip
	// NginxShim is NGINX Gateway Fabric's endpoint-picker shim: the
	// request headers without pseudo headers or protocol_config, names in
	// Go's canonical form and values in value (not raw_value), end_of_stream
	// only when there is no body; the whole body in one message with
	// end_of_stream; then a half-close, and answers are read until the
	// picker ends the stream. Only the x-gateway-destination-endpoint
	// raw_value of the request-headers answer is taken, or an immediate
	// response's status and body; body mutations are dropped (NGINX sends
	// the original request upstream). No response phase is sent. The shim
	// opens a new connection per request: use NewPerRequest to play that.
	NginxShim
)

// ResponsePhases reports whether the shape sends the response phases.
func (s Shape) ResponsePhases() bool { return s == Envoy }

// String names the shape as the command-line tools print it.
func (s Shape) String() string {
	switch s {
	case Envoy:
		return "envoy"
	case EnvoySkip:
		return "envoy-skip"
	case NginxShim:
		return "nginx-shim"
	}
	return "shape(" + strconv.Itoa(int(s)) + ")"
}

// responseBodyMode is the response body mode announced in protocol_config.
func (c *Client) responseBodyMode() filterv3.ProcessingMode_BodySendMode {
	if c.shape == EnvoySkip {
		return filterv3.ProcessingMode_NONE
	}
	return c.mode.proto()
}

// halfClose ends the request side of a header-only shape's stream after
// its last request message, as such gateways do; the Envoy shape keeps it
// open for the response phases.
func (ex *Exchange) halfClose() error {
	if ex.c.shape.ResponsePhases() {
		return nil
	}
	if err := ex.stream.CloseSend(); err != nil {
		return fmt.Errorf("half-close: %w", err)
	}
	return nil
}

// readToEnd reads a half-closed stream until the picker ends it: after
// the request phase's answers nothing more may come.
func (ex *Exchange) readToEnd() error {
	m, err := ex.stream.Recv()
	if err == nil {
		return fmt.Errorf("unexpected %T after the request phase of a header-only stream", m.GetResponse())
	}
	if !errors.Is(err, io.EOF) {
		return fmt.Errorf("waiting for the picker to end the stream: %w", err)
	}
	ex.ended = true
	return nil
}

// runShim plays NginxShim's request: headers, the body in one message,
// half-close, then every answer until the picker ends the stream.
func (ex *Exchange) runShim(s *RequestSpec) error {
	hasBody := len(s.Body) > 0
	t0 := time.Now()
	stopped, err := ex.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: shimHeaders(s)}, EndOfStream: !hasBody},
	}})
	if err != nil {
		return err
	}
	if hasBody && !stopped {
		t0 = time.Now()
		if _, err := ex.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: s.Body, EndOfStream: true},
		}}); err != nil {
			return err
		}
	}
	if err := ex.halfClose(); err != nil {
		return err
	}
	answered := false
	for {
		m, err := ex.stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		switch r := m.GetResponse().(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			// The shim answers the client at once and drops the stream
			// with its connection; Close does that here.
			ex.decision.Latency = time.Since(t0)
			ex.decision.Immediate = immediate(r.ImmediateResponse)
			ex.ended = true
			return nil
		case *extprocv3.ProcessingResponse_RequestHeaders:
			if answered {
				return errors.New("request headers answered twice")
			}
			answered = true
			ex.decision.Latency = time.Since(t0)
			ex.takeShimPick(r.RequestHeaders.GetResponse().GetHeaderMutation())
		}
		// Anything else (the body streamed back, trailers answers) is
		// read and dropped, as the shim does.
	}
	if !answered {
		return errors.New("picker closed the stream without answering")
	}
	ex.ended = true
	if hasBody {
		ex.decision.Body = s.Body
	}
	return nil
}

// takeShimPick records the destination header the way the shim reads it:
// from raw_value only, every other mutation ignored.
func (ex *Exchange) takeShimPick(hm *extprocv3.HeaderMutation) {
	for _, o := range hm.GetSetHeaders() {
		if o.GetHeader().GetKey() != extproc.HeaderDestinationEndpoint {
			continue
		}
		v := string(o.GetHeader().GetRawValue())
		ex.decision.Mutation.Set = append(ex.decision.Mutation.Set, Header{Key: extproc.HeaderDestinationEndpoint, Value: v, Action: o.GetAppendAction()})
		ex.decision.Endpoints = splitEndpoints(v)
	}
}

// shimHeaders are the shim's request headers: what a Go HTTP server hands
// it (canonical names, no pseudo headers), each value in Value.
func shimHeaders(s *RequestSpec) []*corev3.HeaderValue {
	h := s.Headers.Clone()
	if h == nil {
		h = http.Header{}
	}
	if len(s.Body) > 0 && h.Get("Content-Length") == "" {
		h.Set("Content-Length", strconv.Itoa(len(s.Body)))
	}
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out []*corev3.HeaderValue
	for _, k := range keys {
		ck := http.CanonicalHeaderKey(k)
		for _, v := range h[k] {
			out = append(out, &corev3.HeaderValue{Key: ck, Value: v})
		}
	}
	return out
}
