package extprocclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/laneway-dev/laneway/pkg/extproc"
)

// Mode is the body send mode the simulated filter is configured with, for
// both directions.
type Mode uint8

const (
	// FullDuplex is FULL_DUPLEX_STREAMED: body chunks go out without waiting
	// for the headers answer and come back as streamed body responses.
	FullDuplex Mode = iota
	// Buffered is BUFFERED: the headers are answered before the whole body
	// is sent in one message.
	Buffered
)

func (m Mode) proto() filterv3.ProcessingMode_BodySendMode {
	if m == Buffered {
		return filterv3.ProcessingMode_BUFFERED
	}
	return filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
}

// Options configures a Client. The zero value plays Envoy in
// FULL_DUPLEX_STREAMED mode with 62,000-byte body messages and every
// response phase.
type Options struct {
	// Shape is the gateway played: Envoy with every phase (the zero
	// value), or a header-only gateway that sends no response phase.
	Shape Shape
	// Mode is the body send mode of the Envoy shapes; NginxShim ignores it.
	Mode Mode
	// ChunkBytes is the largest body message the Envoy shapes send; 0
	// means extproc.MaxChunkBytes.
	ChunkBytes int
}

// Client opens ext_proc streams to one picker. It is safe for concurrent use.
type Client struct {
	pc    extprocv3.ExternalProcessorClient
	dial  func() (*grpc.ClientConn, error) // set: a new connection per exchange
	shape Shape
	mode  Mode
	chunk int
}

// New returns a Client using conn, which must reach an ext_proc server,
// for every exchange: one long-lived connection carrying many streams, as
// Envoy holds.
func New(conn grpc.ClientConnInterface, opts Options) *Client {
	c := newClient(opts)
	c.pc = extprocv3.NewExternalProcessorClient(conn)
	return c
}

// NewPerRequest returns a Client that opens a new connection with dial
// for every exchange and closes it when the exchange ends, as NGINX
// Gateway Fabric's endpoint-picker shim does.
func NewPerRequest(dial func() (*grpc.ClientConn, error), opts Options) *Client {
	c := newClient(opts)
	c.dial = dial
	return c
}

func newClient(opts Options) *Client {
	if opts.ChunkBytes <= 0 {
		opts.ChunkBytes = extproc.MaxChunkBytes
	}
	return &Client{shape: opts.Shape, mode: opts.Mode, chunk: opts.ChunkBytes}
}

// Shape returns the gateway shape the client plays.
func (c *Client) Shape() Shape { return c.shape }

// RequestSpec describes one HTTP request as the gateway saw it.
type RequestSpec struct {
	// Method defaults to POST.
	Method string
	// Path (with query) defaults to "/".
	Path string
	// Authority defaults to "localhost".
	Authority string
	// Scheme defaults to "http".
	Scheme string
	// Headers are the regular request headers; names are lower-cased on the
	// wire. content-length is added for a non-empty Body when absent.
	Headers http.Header
	// Body is the request body; empty means the headers end the request.
	Body []byte
	// Trailers, when non-empty, follow the body as a trailers message
	// (FullDuplex mode only).
	Trailers http.Header
	// Subset, when non-nil, is sent as the subset hint filter metadata.
	Subset *SubsetHint
	// Metadata, when non-nil, is more forwarded filter metadata by
	// namespace (what Envoy's metadata_options.forwarding_namespaces
	// sends, e.g. a JWT filter's claims).
	Metadata map[string]*structpb.Struct
}

// SubsetHint is the envoy.lb.subset_hint filter metadata of a request.
type SubsetHint struct {
	// Endpoints are "ip[:port]" entries; empty is a present but empty hint.
	Endpoints []string
	// AsString sends the hint as one comma separated string instead of a
	// list, the form header-to-metadata filters produce.
	AsString bool
}

// Header is one header as set by a mutation.
type Header struct {
	// Key is the lower-cased header name.
	Key string
	// Value is the header value.
	Value string
	// Action is how the value combines with an existing one; Envoy's default
	// (the zero value) appends.
	Action corev3.HeaderValueOption_HeaderAppendAction
}

// HeaderMutation is a set of header changes the picker asked for.
type HeaderMutation struct {
	// Set lists headers to set, in order.
	Set []Header
	// Remove lists header names to remove.
	Remove []string
}

// Get returns the last value set for a header name (case-insensitive).
func (m *HeaderMutation) Get(name string) (string, bool) {
	for i := len(m.Set) - 1; i >= 0; i-- {
		if strings.EqualFold(m.Set[i].Key, name) {
			return m.Set[i].Value, true
		}
	}
	return "", false
}

// Apply applies the mutation to h the way Envoy does: removals first, then
// each set with its append action. Pseudo headers are skipped since
// net/http has no place for them.
func (m *HeaderMutation) Apply(h http.Header) {
	for _, k := range m.Remove {
		h.Del(k)
	}
	for _, s := range m.Set {
		if strings.HasPrefix(s.Key, ":") {
			continue
		}
		_, exists := h[http.CanonicalHeaderKey(s.Key)]
		switch s.Action {
		case corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD:
			h.Add(s.Key, s.Value)
		case corev3.HeaderValueOption_ADD_IF_ABSENT:
			if !exists {
				h.Set(s.Key, s.Value)
			}
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
			if exists {
				h.Set(s.Key, s.Value)
			}
		default: // OVERWRITE_IF_EXISTS_OR_ADD
			h.Set(s.Key, s.Value)
		}
	}
}

func (m *HeaderMutation) add(hm *extprocv3.HeaderMutation) {
	for _, o := range hm.GetSetHeaders() {
		v := string(o.GetHeader().GetRawValue())
		if v == "" {
			v = o.GetHeader().GetValue()
		}
		// Only append_action is read: the picker never sets the deprecated
		// append flag, which append_action replaces.
		m.Set = append(m.Set, Header{Key: strings.ToLower(o.GetHeader().GetKey()), Value: v, Action: o.GetAppendAction()})
	}
	m.Remove = append(m.Remove, hm.GetRemoveHeaders()...)
}

// ImmediateResponse is the picker answering the client directly.
type ImmediateResponse struct {
	// Status is the HTTP status.
	Status int
	// Headers are the response headers the picker set.
	Headers http.Header
	// Body is the response body.
	Body []byte
	// Details is the access-log detail string.
	Details string
}

// Decision is the picker's answer to the request phase.
type Decision struct {
	// Immediate is set when the picker answered the client directly; the
	// other fields are then empty.
	Immediate *ImmediateResponse
	// Endpoints is the x-gateway-destination-endpoint header value, split.
	Endpoints []string
	// MetadataEndpoints is the envoy.lb / x-gateway-destination-endpoint
	// dynamic metadata value, split.
	MetadataEndpoints []string
	// Mutation holds the request header mutations (including the pick).
	Mutation HeaderMutation
	// ClearRouteCache reports that the picker asked for route re-evaluation.
	ClearRouteCache bool
	// Body is the request body to forward upstream, as streamed back (or
	// replaced) by the picker; nil for a request without a body.
	Body []byte
	// Latency is the time from sending the last request message to receiving
	// the request-headers answer (SPEC §13), or the immediate response.
	Latency time.Duration
}

// Routed reports whether the picker chose an endpoint.
func (d *Decision) Routed() bool { return d.Immediate == nil }

// Exchange is one ext_proc stream, one HTTP request. Its methods must be
// called from one goroutine, in protocol order.
type Exchange struct {
	c        *Client
	stream   extprocv3.ExternalProcessor_ProcessClient
	cancel   context.CancelFunc
	conn     *grpc.ClientConn // the exchange's own connection (NewPerRequest)
	decision Decision
	respEnd  bool // the response's end_of_stream went through
	ended    bool // the stream is over: nothing more to send or read
	closed   bool
}

// Start opens a stream, plays the request phases and waits for the picker's
// answer, which Decision returns. ctx bounds the whole exchange: cancelling
// it resets the stream as Envoy does when the client goes away. On error the
// stream is already released.
//
// With a header-only shape Start also half-closes the stream after the
// request and reads it to its end: it returns once the picker has ended
// the stream, and a picker that does not end it keeps Start waiting until
// ctx ends.
func (c *Client) Start(ctx context.Context, spec RequestSpec) (*Exchange, error) {
	pc := c.pc
	var conn *grpc.ClientConn
	if c.dial != nil {
		var err error
		if conn, err = c.dial(); err != nil {
			return nil, fmt.Errorf("connect for an ext_proc stream: %w", err)
		}
		pc = extprocv3.NewExternalProcessorClient(conn)
	}
	sctx, cancel := context.WithCancel(ctx)
	release := func() {
		cancel()
		if conn != nil {
			conn.Close()
		}
	}
	stream, err := pc.Process(sctx)
	if err != nil {
		release()
		return nil, fmt.Errorf("open ext_proc stream: %w", err)
	}
	ex := &Exchange{c: c, stream: stream, cancel: cancel, conn: conn}
	var runErr error
	switch {
	case c.shape == NginxShim:
		runErr = ex.runShim(&spec)
	case c.mode == Buffered:
		runErr = ex.runBuffered(&spec)
	default:
		runErr = ex.runFullDuplex(&spec)
	}
	if runErr == nil && c.shape == EnvoySkip {
		runErr = ex.readToEnd()
	}
	if runErr != nil {
		release()
		return nil, fmt.Errorf("ext_proc request phase for %s %s: %w", spec.method(), spec.path(), runErr)
	}
	if !ex.decision.Routed() || !c.shape.ResponsePhases() {
		// The picker ends the stream after an immediate response, and a
		// header-only stream is over once the request is answered.
		ex.respEnd = true
	}
	return ex, nil
}

// Ended reports whether the stream is already over, so that no response
// phase can follow: a header-only shape's exchange once Start returns.
func (ex *Exchange) Ended() bool { return ex.ended }

// Decision returns the picker's answer to the request phase.
func (ex *Exchange) Decision() *Decision { return &ex.decision }

func (s *RequestSpec) method() string { return def(s.Method, http.MethodPost) }
func (s *RequestSpec) path() string   { return def(s.Path, "/") }

func def(v, d string) string {
	if v == "" {
		return d
	}
	return v
}

// headersMessage builds the first message: headers, protocol_config and the
// subset hint.
func (ex *Exchange) headersMessage(s *RequestSpec, eos bool) *extprocv3.ProcessingRequest {
	hs := []*corev3.HeaderValue{
		{Key: ":authority", RawValue: []byte(def(s.Authority, "localhost"))},
		{Key: ":path", RawValue: []byte(s.path())},
		{Key: ":method", RawValue: []byte(s.method())},
		{Key: ":scheme", RawValue: []byte(def(s.Scheme, "http"))},
	}
	hs = AppendHeaders(hs, s.Headers)
	if len(s.Body) > 0 && s.Headers.Get("content-length") == "" {
		hs = append(hs, &corev3.HeaderValue{Key: "content-length", RawValue: []byte(strconv.Itoa(len(s.Body)))})
	}
	msg := &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: hs}, EndOfStream: eos,
		}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{
			RequestBodyMode:  ex.c.mode.proto(),
			ResponseBodyMode: ex.c.responseBodyMode(),
		},
	}
	if s.Subset != nil {
		var v *structpb.Value
		if s.Subset.AsString {
			v = structpb.NewStringValue(strings.Join(s.Subset.Endpoints, ","))
		} else {
			vals := make([]*structpb.Value, len(s.Subset.Endpoints))
			for i, e := range s.Subset.Endpoints {
				vals[i] = structpb.NewStringValue(e)
			}
			v = structpb.NewListValue(&structpb.ListValue{Values: vals})
		}
		msg.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			extproc.MetadataNamespaceSubset: {Fields: map[string]*structpb.Value{extproc.MetadataKeySubset: v}},
		}}
	}
	if len(s.Metadata) > 0 {
		if msg.MetadataContext == nil {
			msg.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{}}
		}
		for ns, st := range s.Metadata {
			msg.MetadataContext.FilterMetadata[ns] = st
		}
	}
	return msg
}

// AppendHeaders adds h to dst as ext_proc header values: lower-cased, one
// entry per value, in a stable order so runs are reproducible.
func AppendHeaders(dst []*corev3.HeaderValue, h http.Header) []*corev3.HeaderValue {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		lk := strings.ToLower(k)
		for _, v := range h[k] {
			dst = append(dst, &corev3.HeaderValue{Key: lk, RawValue: []byte(v)})
		}
	}
	return dst
}

// send sends one message. io.EOF means the picker already ended the stream
// (for example with an immediate response to an oversized body); the caller
// then stops sending and reads the answer.
func (ex *Exchange) send(m *extprocv3.ProcessingRequest) (stopped bool, err error) {
	if err := ex.stream.Send(m); err != nil {
		if errors.Is(err, io.EOF) {
			return true, nil
		}
		return true, fmt.Errorf("send: %w", err)
	}
	return false, nil
}

func (ex *Exchange) recv() (*extprocv3.ProcessingResponse, error) {
	m, err := ex.stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("picker closed the stream without answering")
		}
		return nil, fmt.Errorf("receive: %w", err)
	}
	return m, nil
}

// sendBody sends the body in chunks; the last one carries end_of_stream
// unless trailers follow, which then end the request.
func (ex *Exchange) sendBody(s *RequestSpec) (stopped bool, msgs int, err error) {
	trailers := len(s.Trailers) > 0
	body := s.Body
	for off := 0; ; off += ex.c.chunk {
		end := min(off+ex.c.chunk, len(body))
		last := end == len(body)
		stopped, err = ex.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: body[off:end], EndOfStream: last && !trailers},
		}})
		if stopped || err != nil {
			return stopped, msgs, err
		}
		msgs++
		if last {
			break
		}
	}
	if trailers {
		stopped, err = ex.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
			RequestTrailers: &extprocv3.HttpTrailers{Trailers: &corev3.HeaderMap{Headers: AppendHeaders(nil, s.Trailers)}},
		}})
	}
	return stopped, msgs, err
}

// runFullDuplex plays FULL_DUPLEX_STREAMED: headers and the whole body go out
// at once, then the answer comes: an immediate response, or the headers
// answer followed by the body streamed back. A picker that answers body
// messages with plain (non-streamed) body responses, as some do, is read as
// passing each message through unchanged.
func (ex *Exchange) runFullDuplex(s *RequestSpec) error {
	hasBody := len(s.Body) > 0 || len(s.Trailers) > 0
	// A stopped send means the picker already answered (and ended the
	// stream); the answer is read below either way.
	stopped, err := ex.send(ex.headersMessage(s, !hasBody))
	if err != nil {
		return err
	}
	bodyMsgs := 0
	if hasBody && !stopped {
		if _, bodyMsgs, err = ex.sendBody(s); err != nil {
			return err
		}
	}
	if err := ex.halfClose(); err != nil {
		return err
	}
	t0 := time.Now()

	var (
		gotHeaders  bool
		bodyDone    = !hasBody
		trailerDone = len(s.Trailers) == 0
		plain       int
		streamed    []byte
		sawStreamed bool
	)
	for !gotHeaders || !bodyDone || !trailerDone {
		m, err := ex.recv()
		if err != nil {
			return err
		}
		switch r := m.GetResponse().(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			ex.decision.Latency = time.Since(t0)
			ex.decision.Immediate = immediate(r.ImmediateResponse)
			return nil
		case *extprocv3.ProcessingResponse_RequestHeaders:
			if gotHeaders {
				return errors.New("request headers answered twice")
			}
			gotHeaders = true
			ex.decision.Latency = time.Since(t0)
			ex.takePick(r.RequestHeaders.GetResponse(), m.GetDynamicMetadata())
		case *extprocv3.ProcessingResponse_RequestBody:
			if sr := r.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse(); sr != nil {
				sawStreamed = true
				streamed = append(streamed, sr.GetBody()...)
				if sr.GetEndOfStream() {
					bodyDone = true
				}
			} else if plain++; plain >= bodyMsgs {
				bodyDone = true
			}
		case *extprocv3.ProcessingResponse_RequestTrailers:
			trailerDone = true
			bodyDone = true // trailers end a streamed body without end_of_stream
		default:
			return fmt.Errorf("unexpected answer %T in the request phase", r)
		}
	}
	switch {
	case sawStreamed:
		ex.decision.Body = streamed
	case hasBody:
		ex.decision.Body = s.Body
	}
	return nil
}

// runBuffered plays BUFFERED: the headers are answered first (with the pick
// when there is no body), then the whole body goes out and its answer carries
// the pick and any body replacement.
func (ex *Exchange) runBuffered(s *RequestSpec) error {
	hasBody := len(s.Body) > 0
	t0 := time.Now()
	if _, err := ex.send(ex.headersMessage(s, !hasBody)); err != nil {
		return err
	}
	if !hasBody {
		if err := ex.halfClose(); err != nil {
			return err
		}
	}
	m, err := ex.recv()
	if err != nil {
		return err
	}
	switch r := m.GetResponse().(type) {
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		ex.decision.Latency = time.Since(t0)
		ex.decision.Immediate = immediate(r.ImmediateResponse)
		return nil
	case *extprocv3.ProcessingResponse_RequestHeaders:
		if !hasBody {
			ex.decision.Latency = time.Since(t0)
			ex.takePick(r.RequestHeaders.GetResponse(), m.GetDynamicMetadata())
			return nil
		}
		ex.decision.Mutation.add(r.RequestHeaders.GetResponse().GetHeaderMutation())
	default:
		return fmt.Errorf("unexpected answer %T to request headers", r)
	}
	t0 = time.Now()
	if _, err := ex.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: s.Body, EndOfStream: true},
	}}); err != nil {
		return err
	}
	if err := ex.halfClose(); err != nil {
		return err
	}
	if m, err = ex.recv(); err != nil {
		return err
	}
	ex.decision.Latency = time.Since(t0)
	switch r := m.GetResponse().(type) {
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		ex.decision.Immediate = immediate(r.ImmediateResponse)
		ex.decision.Mutation = HeaderMutation{}
	case *extprocv3.ProcessingResponse_RequestBody:
		common := r.RequestBody.GetResponse()
		ex.takePick(common, m.GetDynamicMetadata())
		ex.decision.Body = mutatedBody(common.GetBodyMutation(), s.Body)
	default:
		return fmt.Errorf("unexpected answer %T to the request body", r)
	}
	return nil
}

// takePick records the pick from a common response and dynamic metadata.
func (ex *Exchange) takePick(common *extprocv3.CommonResponse, md *structpb.Struct) {
	d := &ex.decision
	d.ClearRouteCache = d.ClearRouteCache || common.GetClearRouteCache()
	d.Mutation.add(common.GetHeaderMutation())
	if v, ok := d.Mutation.Get(extproc.HeaderDestinationEndpoint); ok {
		d.Endpoints = splitEndpoints(v)
	}
	lb := md.GetFields()[extproc.MetadataNamespaceLB].GetStructValue()
	if v := lb.GetFields()[extproc.MetadataKeyDestination].GetStringValue(); v != "" {
		d.MetadataEndpoints = splitEndpoints(v)
	}
}

func splitEndpoints(v string) []string {
	var out []string
	for p := range strings.SplitSeq(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// mutatedBody applies a non-streamed body mutation to the original body.
func mutatedBody(bm *extprocv3.BodyMutation, orig []byte) []byte {
	switch m := bm.GetMutation().(type) {
	case *extprocv3.BodyMutation_Body:
		return m.Body
	case *extprocv3.BodyMutation_ClearBody:
		if m.ClearBody {
			return []byte{}
		}
	case *extprocv3.BodyMutation_StreamedResponse:
		return m.StreamedResponse.GetBody()
	}
	return orig
}

func immediate(ir *extprocv3.ImmediateResponse) *ImmediateResponse {
	out := &ImmediateResponse{
		Status:  int(ir.GetStatus().GetCode()),
		Headers: http.Header{},
		Body:    ir.GetBody(),
		Details: ir.GetDetails(),
	}
	var m HeaderMutation
	m.add(ir.GetHeaders())
	m.Apply(out.Headers)
	return out
}

// SendResponseHeaders plays the upstream's response headers (status, headers,
// and end_of_stream for a response without a body). served, when not empty,
// goes in the response-path metadata envoy.lb /
// x-gateway-destination-endpoint-served. It returns the picker's header
// mutation for the client response.
func (ex *Exchange) SendResponseHeaders(status int, h http.Header, endOfStream bool, served string) (*HeaderMutation, error) {
	if !ex.c.shape.ResponsePhases() {
		return nil, fmt.Errorf("the %s gateway sends no response phase", ex.c.shape)
	}
	if ex.closed || ex.respEnd {
		return nil, errors.New("response headers after the exchange ended")
	}
	hs := []*corev3.HeaderValue{{Key: ":status", RawValue: []byte(strconv.Itoa(status))}}
	msg := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: AppendHeaders(hs, h)}, EndOfStream: endOfStream},
	}}
	if served != "" {
		msg.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			extproc.MetadataNamespaceLB: {Fields: map[string]*structpb.Value{
				extproc.MetadataKeyServed: structpb.NewStringValue(served),
			}},
		}}
	}
	if err := ex.stream.Send(msg); err != nil {
		return nil, fmt.Errorf("send response headers: %w", err)
	}
	m, err := ex.recv()
	if err != nil {
		return nil, fmt.Errorf("response headers: %w", err)
	}
	r, ok := m.GetResponse().(*extprocv3.ProcessingResponse_ResponseHeaders)
	if !ok {
		return nil, fmt.Errorf("unexpected answer %T to response headers", m.GetResponse())
	}
	var mut HeaderMutation
	mut.add(r.ResponseHeaders.GetResponse().GetHeaderMutation())
	if endOfStream {
		ex.respEnd = true
	}
	return &mut, nil
}

// SendResponseBody plays one response body chunk (end_of_stream on the last,
// which may be empty) and returns what the picker passes on to the client.
// Chunks above the client's ChunkBytes are split into several messages, the
// way Envoy never sends a body message larger than its buffers. Each body
// message is expected to get exactly one answer, which is how FULL_DUPLEX
// pickers that pass bodies through (Laneway's included) behave.
func (ex *Exchange) SendResponseBody(chunk []byte, eos bool) ([]byte, error) {
	if !ex.c.shape.ResponsePhases() {
		return nil, fmt.Errorf("the %s gateway sends no response phase", ex.c.shape)
	}
	if ex.closed || ex.respEnd {
		return nil, errors.New("response body after the exchange ended")
	}
	var out []byte
	for off := 0; ; off += ex.c.chunk {
		end := min(off+ex.c.chunk, len(chunk))
		last := end == len(chunk)
		part := chunk[off:end]
		if err := ex.stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
			ResponseBody: &extprocv3.HttpBody{Body: part, EndOfStream: last && eos},
		}}); err != nil {
			return out, fmt.Errorf("send response body: %w", err)
		}
		m, err := ex.recv()
		if err != nil {
			return out, fmt.Errorf("response body: %w", err)
		}
		r, ok := m.GetResponse().(*extprocv3.ProcessingResponse_ResponseBody)
		if !ok {
			return out, fmt.Errorf("unexpected answer %T to a response body chunk", m.GetResponse())
		}
		got := mutatedBody(r.ResponseBody.GetResponse().GetBodyMutation(), part)
		if out == nil && last {
			out = got // the usual single message: no copy
		} else {
			out = append(out, got...)
		}
		if last {
			break
		}
	}
	if eos {
		ex.respEnd = true
	}
	return out, nil
}

// Respond plays a whole response: headers, then each chunk in turn, then the
// end of stream. It returns the header mutation and the body the client would
// receive.
func (ex *Exchange) Respond(status int, h http.Header, chunks ...[]byte) (*HeaderMutation, []byte, error) {
	mut, err := ex.SendResponseHeaders(status, h, len(chunks) == 0, "")
	if err != nil {
		return nil, nil, err
	}
	var body []byte
	for i, c := range chunks {
		out, err := ex.SendResponseBody(c, i == len(chunks)-1)
		if err != nil {
			return mut, body, err
		}
		body = append(body, out...)
	}
	return mut, body, nil
}

// Close ends the exchange. After a complete response the stream is
// half-closed and drained so the picker sees an orderly end; otherwise it is
// reset, which is what Envoy does when the client or upstream goes away.
// A stream already over (Ended) only has its resources released, and an
// exchange on its own connection closes that too. Close is idempotent.
func (ex *Exchange) Close() error {
	if ex.closed {
		return nil
	}
	ex.closed = true
	defer func() {
		ex.cancel()
		if ex.conn != nil {
			ex.conn.Close()
		}
	}()
	if !ex.respEnd || ex.ended {
		return nil
	}
	if err := ex.stream.CloseSend(); err != nil {
		return fmt.Errorf("close ext_proc stream: %w", err)
	}
	for {
		if _, err := ex.stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("drain ext_proc stream: %w", err)
		}
	}
}
