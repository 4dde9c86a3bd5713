package extproc

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/laneway-dev/laneway/pkg/fault"
)

// stream is the state of one ext_proc stream. It lives on the stream's gRPC
// goroutine only, so it needs no locking. A single goroutine suffices because
// the protocol never needs a concurrent read while the Decider blocks: the
// request is complete by then, and a gateway that gives up cancels the stream,
// which ends ctx and with it the Decider's wait.
type stream struct {
	s   *Server
	srv extprocv3.ExternalProcessor_ProcessServer
	ctx context.Context

	started   bool // first message seen (protocol_config read)
	reqMode   filterv3.ProcessingMode_BodySendMode
	respMode  filterv3.ProcessingMode_BodySendMode
	gotHeader bool // request headers seen
	answered  bool // the request's one answer (pick or immediate response) was sent

	req         Request
	bodyHint    int        // content-length, when usable as the body's capacity
	reserved    int64      // bytes of the server's budget this stream holds for its body
	hdrHeld     int64      // bytes of the server's budget this stream holds for its headers
	clock       *bodyClock // times the body's arrival; nil outside the body phase
	conformance bool       // the request carried the conformance selection header
	pick        string     // the first endpoint: the one the gateway is told to use
	list        string     // the joined endpoint list (pick and fallbacks)

	dispatched bool      // the Decider returned a Decision
	lc         Lifecycle // may be nil even when dispatched
	firstByte  bool
	done       bool

	outcome string
}

// protocolError ends the stream with a gRPC error for a gateway that broke
// the protocol. Envoy (failure_mode_allow false) turns it into a 500 for the
// client, which is the honest answer to a misconfigured filter.
func (st *stream) protocolError(c codes.Code, format string, args ...any) error {
	st.outcome = OutcomeProtocolError
	err := status.Errorf(c, format, args...)
	st.s.log.V(2).Info("ext_proc protocol error", "error", err.Error())
	return err
}

// runContained is run with a panic contained to this stream: a bug that
// one request triggers must not take down the process and every other
// stream with it (gRPC does not recover handler panics). The panic is
// logged once with its stack; the stream is answered 500 with a JSON error
// when it has had no answer yet, and otherwise ends with a gRPC error,
// which the gateway turns into its own failure.
func (st *stream) runContained() (err error) {
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		// The body deadline must not answer too; if it already did, its
		// answer is the stream's one.
		fired := st.stopBodyClock()
		st.s.log.Error(fmt.Errorf("panic: %v", r), "stream handler panicked; the stream is answered and the picker keeps serving",
			"answered", st.answered, "stack", string(debug.Stack()))
		if fired {
			return
		}
		st.outcome = OutcomePanic
		if st.answered {
			err = status.Error(codes.Internal, "endpoint picker internal error")
			return
		}
		if serr := st.srv.Send(immediateResponse(http.StatusInternalServerError, "internal_error", nil,
			"internal error in the endpoint picker", 0)); serr != nil {
			err = fmt.Errorf("send ext_proc response: %w", serr)
			return
		}
		st.answered = true
		err = nil
	}()
	return st.run()
}

// run reads the stream until the gateway ends it or the request is answered
// directly.
func (st *stream) run() error {
	for {
		msg, err := st.srv.Recv()
		if err != nil {
			if recvDone(err) {
				return nil
			}
			return fmt.Errorf("receive ext_proc message: %w", err)
		}
		if !st.started {
			st.started = true
			if msg.GetObservabilityMode() {
				// The picker must answer every request; a filter that ignores
				// answers cannot route.
				return st.protocolError(codes.FailedPrecondition, "observability_mode is not supported by an endpoint picker")
			}
			st.reqMode, st.respMode = bodyModes(msg.GetProtocolConfig())
		}
		if st.clock != nil && !bodyPhase(msg) && st.stopBodyClock() {
			return nil // the body deadline answered the stream
		}
		var end bool
		switch r := msg.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			end, err = st.onRequestHeaders(msg, r.RequestHeaders)
		case *extprocv3.ProcessingRequest_RequestBody:
			end, err = st.onRequestBody(r.RequestBody)
		case *extprocv3.ProcessingRequest_RequestTrailers:
			end, err = st.onRequestTrailers()
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			err = st.onResponseHeaders(msg, r.ResponseHeaders)
		case *extprocv3.ProcessingRequest_ResponseBody:
			err = st.onResponseBody(r.ResponseBody)
		case *extprocv3.ProcessingRequest_ResponseTrailers:
			err = st.onResponseTrailers()
		default:
			err = st.protocolError(codes.InvalidArgument, "unexpected ext_proc message %T", r)
		}
		if err != nil || end {
			return err
		}
	}
}

// bodyPhase reports whether msg belongs to the request body phase: a body
// chunk, or the trailers that end a body.
func bodyPhase(msg *extprocv3.ProcessingRequest) bool {
	switch msg.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestBody, *extprocv3.ProcessingRequest_RequestTrailers:
		return true
	}
	return false
}

// bodyModes reads the body send modes from the protocol_config Envoy sends in
// a stream's first message. Without one (older gateways, hand-written
// clients) both directions are taken as FULL_DUPLEX_STREAMED, the mode the
// inference extension protocol prescribes; NONE in a present config is a real
// NONE.
func bodyModes(pc *extprocv3.ProtocolConfiguration) (req, resp filterv3.ProcessingMode_BodySendMode) {
	if pc == nil {
		return filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	}
	return pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
}

func (st *stream) onRequestHeaders(msg *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) (bool, error) {
	if st.gotHeader {
		return true, st.protocolError(codes.InvalidArgument, "request headers sent twice")
	}
	st.gotHeader = true
	// The header block is measured before it is copied: one too large is
	// refused without keeping any of it, and the rest count against the
	// budget for as long as the stream keeps them.
	size := headerBytes(h.GetHeaders())
	if size > st.s.maxHeader {
		return true, st.sendHeadersTooLarge(size)
	}
	if held, ok := st.s.held.reserveHeaders(int64(size)); !ok {
		return true, st.sendHeldBytes(held, int64(size))
	}
	st.hdrHeld = int64(size)
	st.req.Headers = headerMap(h.GetHeaders())
	st.req.Metadata = msg.GetMetadataContext()
	st.req.Subset, st.req.HasSubset = subsetHint(st.req.Metadata)
	if st.s.conformance {
		if v, ok := st.req.Headers[HeaderTestEndpointSelection]; ok {
			st.conformance = true
			st.req.TestEndpoints = splitList(nil, v)
		}
	}

	if h.GetEndOfStream() || st.reqMode == filterv3.ProcessingMode_NONE {
		// Nothing more of the request will come: decide on the headers.
		return st.decideAndAnswer(answerHeaders, false)
	}
	switch st.reqMode {
	case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_BUFFERED:
		// An announced body too large for any budget is refused now. Its
		// bytes are not reserved before they arrive: an announcement costs
		// a client nothing, so reserving it would let one that never
		// sends hold the budget against everyone (issue 22). The length
		// only sizes the buffer, which grows as the bytes come.
		if n, err := strconv.Atoi(st.req.Headers["content-length"]); err == nil && n > 0 {
			if n > st.s.maxBody {
				return true, st.sendBodyTooLarge(n)
			}
			st.bodyHint = n
		}
		if st.reqMode == filterv3.ProcessingMode_BUFFERED {
			// Envoy sends the buffered body only after the headers are
			// answered, so the headers get an empty answer now and the
			// pick rides on the body response (header mutations on a body
			// response take effect in BUFFERED mode).
			if err := st.send(emptyRequestHeaders); err != nil {
				return true, err
			}
		}
		// The buffer is made when a body turns out to come in several
		// messages: the usual single-message body is kept as received.
		if st.s.bodyTimeout > 0 {
			st.clock = startBodyClock(st, st.s.bodyTimeout)
		}
		return false, nil
	}
	return true, st.protocolError(codes.FailedPrecondition,
		"request_body_mode %s is not supported; configure FULL_DUPLEX_STREAMED or BUFFERED", st.reqMode)
}

func (st *stream) onRequestBody(b *extprocv3.HttpBody) (bool, error) {
	complete, end, err := st.bodyMessage(b)
	if end || err != nil || !complete {
		return end, err
	}
	if st.reqMode == filterv3.ProcessingMode_BUFFERED {
		return st.decideAndAnswer(answerBody, false)
	}
	return st.decideAndAnswer(answerHeadersAndBody, false)
}

// bodyMessage takes one body message in the body phase, under the body
// clock: complete says the body is whole (the decision is next), end that
// the stream has nothing left to do (it was answered, by this message or
// by the deadline).
func (st *stream) bodyMessage(b *extprocv3.HttpBody) (complete, end bool, err error) {
	if !st.lockBody() {
		return false, true, nil
	}
	defer func() { st.unlockBody(complete || end) }()
	return st.takeBody(b)
}

// takeBody adds a body message to the request (see bodyMessage).
func (st *stream) takeBody(b *extprocv3.HttpBody) (complete, end bool, err error) {
	if !st.gotHeader || st.answered {
		return false, true, st.protocolError(codes.InvalidArgument, "request body outside the request body phase")
	}
	fault.At("request_body", st.req.Headers)
	if len(st.req.Body)+len(b.GetBody()) > st.s.maxBody {
		return false, true, st.sendBodyTooLarge(len(st.req.Body) + len(b.GetBody()))
	}
	switch st.reqMode {
	case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		if len(st.req.Body) == 0 && b.GetEndOfStream() {
			// The common single-chunk body: kept as received, no copy.
			if ok, err := st.hold(int64(len(b.GetBody()))); !ok {
				return false, true, err
			}
			st.req.Body = b.GetBody()
		} else if ok, err := st.appendBody(b.GetBody()); !ok {
			return false, true, err
		}
		return b.GetEndOfStream(), false, nil
	case filterv3.ProcessingMode_BUFFERED:
		// The whole body arrives in one message; end_of_stream is false only
		// when trailers follow, which changes nothing here.
		if ok, err := st.hold(int64(len(b.GetBody()))); !ok {
			return false, true, err
		}
		st.req.Body = b.GetBody()
		return true, false, nil
	}
	return false, true, st.protocolError(codes.InvalidArgument, "request body in body mode %s", st.reqMode)
}

// appendBody adds a chunk of a streamed body to the buffer. The buffer
// grows as bytes arrive, doubling up to the announced length: the first
// allocation is at most bodySlice beyond what arrived, whatever
// content-length says. Its capacity is held in the budget; when the
// budget cannot take the doubled capacity the buffer grows by as much as
// the budget has room for (so a budget running short costs one copy, not
// one per chunk), and when it cannot take what the body needs the request
// is answered 429 (ok false).
func (st *stream) appendBody(chunk []byte) (ok bool, err error) {
	body := st.req.Body
	need := len(body) + len(chunk)
	if need <= cap(body) {
		st.req.Body = append(body, chunk...)
		return true, nil
	}
	want := max(need, 2*cap(body))
	if body == nil && st.bodyHint > 0 {
		want = max(need, min(st.bodyHint, bodySlice))
	}
	if st.bodyHint >= need {
		want = min(want, st.bodyHint)
	}
	size, ok, err := st.holdUpTo(int64(need), int64(want))
	if !ok {
		return false, err
	}
	grown := make([]byte, len(body), size)
	copy(grown, body)
	st.req.Body = append(grown, chunk...)
	return true, nil
}

// hold makes sure the stream holds n bytes of the budget, reserving what it
// lacks; when the budget cannot take them it answers 429 held_bytes and
// reports ok false (err is the send's).
func (st *stream) hold(n int64) (ok bool, err error) {
	held, ok := st.holdQuiet(n)
	if ok {
		return true, nil
	}
	return false, st.sendHeldBytes(held, n-st.reserved)
}

// holdUpTo makes sure the stream holds at least lo bytes of the budget,
// and up to hi as far as the budget has room; it returns the bytes it
// holds then. When the budget cannot take lo it answers 429 held_bytes
// and reports ok false (err is the send's).
func (st *stream) holdUpTo(lo, hi int64) (n int64, ok bool, err error) {
	if lo <= st.reserved {
		return st.reserved, true, nil
	}
	got, held, ok := st.s.held.reserveUpTo(lo-st.reserved, hi-st.reserved)
	if !ok {
		return 0, false, st.sendHeldBytes(held, lo-st.reserved)
	}
	st.reserved += got
	return st.reserved, true, nil
}

// holdQuiet is hold without the answer: it returns the budget's bytes
// held when it could not take them.
func (st *stream) holdQuiet(n int64) (held int64, ok bool) {
	if n <= st.reserved {
		return 0, true
	}
	held, ok = st.s.held.reserve(n - st.reserved)
	if ok {
		st.reserved = n
	}
	return held, ok
}

// releaseBody lets go of the request body and gives its bytes back to the
// budget: once it has been passed back to the gateway, or the stream ends.
func (st *stream) releaseBody() {
	st.req.Body = nil
	if st.reserved != 0 {
		st.s.held.release(st.reserved)
		st.reserved = 0
	}
}

// releaseHeaders gives the header block's bytes back to the budget: when
// the stream ends, or when its body deadline answered it (the headers are
// then dropped, and nothing reads them again).
func (st *stream) releaseHeaders() {
	if st.hdrHeld != 0 {
		st.s.held.releaseHeaders(st.hdrHeld)
		st.hdrHeld = 0
	}
}

func (st *stream) onRequestTrailers() (bool, error) {
	// Trailers end the body phase.
	if st.stopBodyClock() {
		return true, nil // the body deadline answered the stream
	}
	if st.gotHeader && !st.answered && st.reqMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		// Trailers end a streamed body that had no end_of_stream chunk.
		return st.decideAndAnswer(answerHeadersAndBody, true)
	}
	return false, st.send(emptyRequestTrailers)
}

// answerKind says which message carries the pick.
type answerKind uint8

const (
	answerHeaders        answerKind = iota // request-headers response, no body to return
	answerHeadersAndBody                   // request-headers response, then the body streamed back
	answerBody                             // BUFFERED: body response with header and body mutations
)

// decideAndAnswer asks the Decider and sends the request's one answer. It
// reports end=true when the stream has nothing left to do (answered directly
// or the gateway is gone).
func (st *stream) decideAndAnswer(kind answerKind, trailers bool) (end bool, err error) {
	d, err := st.s.decider.Decide(st.ctx, &st.req)
	if err != nil {
		if cerr := st.ctx.Err(); cerr != nil {
			// The gateway went away or its deadline passed: nobody to answer.
			// The status says which, for the gateway's own diagnostics.
			return true, status.FromContextError(cerr).Err()
		}
		return true, st.sendDeciderError(err)
	}
	st.dispatched = true
	st.lc = d.Lifecycle
	if len(d.Endpoints) == 0 {
		return true, st.sendDeciderError(errors.New("decider returned no endpoint"))
	}
	st.pick, st.list = d.Endpoints[0], strings.Join(d.Endpoints, ",")
	header := st.list
	if st.s.headerPickOnly {
		header = st.pick
	}

	body := st.req.Body
	newLen := -1 // content-length to set; -1 leaves the header alone
	if d.Body != nil && kind != answerHeaders {
		// The replacement is what the stream holds from now on; an
		// admitted request keeps it whatever the budget says.
		body, newLen = d.Body, len(d.Body)
		st.releaseBody()
		st.reserved = int64(len(body))
		st.s.held.force(st.reserved)
	}
	if kind == answerHeaders && d.Body != nil {
		st.s.log.V(4).Info("ignoring body replacement for a request without a body", "endpoints", st.list)
	}

	switch kind {
	case answerHeaders, answerHeadersAndBody:
		var resp *extprocv3.ProcessingResponse
		if newLen < 0 && len(d.Endpoints) == 1 && len(d.Headers) == 0 && len(d.RemoveHeaders) == 0 {
			resp = st.s.pickAnswer(st.pick)
		} else {
			resp = pickResponse(header, st.list, newLen, nil, false)
			addHeaders(resp, d.Headers, d.RemoveHeaders)
		}
		if err := st.send(resp); err != nil {
			return true, err
		}
		st.answered = true
		st.outcome = OutcomeRouted
		if kind == answerHeadersAndBody {
			if err := st.sendStreamedRequestBody(body, trailers); err != nil {
				return true, err
			}
		}
		st.releaseBody() // passed back: nothing more to hold for it
	case answerBody:
		var replace []byte
		if newLen >= 0 {
			replace = body
		}
		resp := pickResponse(header, st.list, newLen, replace, true)
		addHeaders(resp, d.Headers, d.RemoveHeaders)
		if err := st.send(resp); err != nil {
			return true, err
		}
		st.answered = true
		st.outcome = OutcomeRouted
		st.releaseBody()
	}
	if st.s.log.V(4).Enabled() {
		st.s.log.V(4).Info("routed", "endpoints", st.list, "bodyBytes", len(body))
	}
	return false, nil
}

// sendStreamedRequestBody streams the (possibly replaced) request body back
// in chunks of at most MaxChunkBytes. Always at least one message is sent so
// the gateway sees the end of the body even when it is empty. When trailers
// follow, the body does not end the stream; the trailers answer does.
func (st *stream) sendStreamedRequestBody(body []byte, trailers bool) error {
	if err := st.sendChunks(body, !trailers, true); err != nil {
		return err
	}
	if trailers {
		return st.send(emptyRequestTrailers)
	}
	return nil
}

// sendChunks sends body as streamed body messages of at most MaxChunkBytes
// each, of the request's body or the response's: at least one message, so
// an empty body still reaches the gateway, and only the last one carries
// eos.
func (st *stream) sendChunks(body []byte, eos, request bool) error {
	for off := 0; ; off += MaxChunkBytes {
		end := min(off+MaxChunkBytes, len(body))
		last := end == len(body)
		if err := st.send(streamedBody(body[off:end], last && eos, request)); err != nil {
			return err
		}
		if last {
			return nil
		}
	}
}

func (st *stream) onResponseHeaders(msg *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) error {
	if !st.answered {
		return st.protocolError(codes.InvalidArgument, "response headers before the request was answered")
	}
	fault.At("response_headers", st.req.Headers)
	var served string
	if st.conformance {
		// Without the gateway's served-endpoint metadata the best statement
		// is the pick itself, which is what the gateway was told to use.
		if served = servedEndpoint(msg.GetMetadataContext()); served == "" {
			served = st.pick
		}
	}
	if err := st.send(responseHeadersResponse(served)); err != nil {
		return err
	}
	switch {
	case h.GetEndOfStream():
		st.responseEnd()
	case st.respMode == filterv3.ProcessingMode_NONE:
		// The body will not pass through us: the headers are the earliest
		// sign that prefill is over.
		st.markFirstByte()
	}
	return nil
}

func (st *stream) onResponseBody(b *extprocv3.HttpBody) error {
	if !st.answered {
		return st.protocolError(codes.InvalidArgument, "response body before the request was answered")
	}
	if len(b.GetBody()) > 0 {
		st.markFirstByte()
	}
	if st.respMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		// Echo at once, chunk for chunk: nothing is buffered, so SSE events
		// reach the client as the model server writes them.
		if err := st.sendChunks(b.GetBody(), b.GetEndOfStream(), false); err != nil {
			return err
		}
	} else {
		// STREAMED, BUFFERED and BUFFERED_PARTIAL: an empty answer passes the
		// chunk on unchanged.
		if err := st.send(emptyResponseBody); err != nil {
			return err
		}
	}
	if b.GetEndOfStream() {
		st.responseEnd()
	}
	return nil
}

func (st *stream) onResponseTrailers() error {
	if err := st.send(emptyResponseTrailers); err != nil {
		return err
	}
	st.responseEnd()
	return nil
}

// markFirstByte reports the first response byte once.
func (st *stream) markFirstByte() {
	if !st.dispatched || st.firstByte {
		return
	}
	st.firstByte = true
	if st.lc != nil {
		st.lc.FirstByte()
	}
}

// responseEnd reports a complete response: first byte (if the response had
// no body) then done, each once.
func (st *stream) responseEnd() {
	st.markFirstByte()
	st.finish()
}

// finish calls Lifecycle.Done once for a dispatched request, whatever ended
// the stream.
func (st *stream) finish() {
	if !st.dispatched || st.done {
		return
	}
	st.done = true
	if st.lc != nil {
		st.lc.Done()
	}
}

// send sends one message. A failure means the gateway is gone: the stream
// ends and the outcome says so unless the answer was already sent.
func (st *stream) send(resp *extprocv3.ProcessingResponse) error {
	if err := st.srv.Send(resp); err != nil {
		if !st.answered {
			st.outcome = OutcomeClientGone
		}
		return fmt.Errorf("send ext_proc response: %w", err)
	}
	return nil
}

// heldBytesDetails is the details object of a 429 held_bytes answer, in
// the shape of the queue limits' 429s.
type heldBytesDetails struct {
	LimitKind string `json:"limit_kind"`
	Current   int64  `json:"current"`
	Limit     int64  `json:"limit"`
	Requested int64  `json:"requested"`
}

// sendHeldBytes answers 429 held_bytes: held bytes were held by all
// streams when this one asked for requested more.
func (st *stream) sendHeldBytes(held, requested int64) error {
	msg := fmt.Sprintf("request bodies held by the endpoint picker: %d bytes held, this request needs %d more, over the limit of %d bytes",
		held, requested, st.s.held.limit)
	body, _ := json.Marshal(struct {
		Error   string           `json:"error"`
		Details heldBytesDetails `json:"details"`
	}{msg, heldBytesDetails{LimitKind: "held_bytes", Current: held, Limit: st.s.held.limit, Requested: requested}}) // cannot fail
	if err := st.send(immediateResponse(429, "held_bytes", body, msg, st.s.retryAfter)); err != nil {
		return err
	}
	st.answered = true
	st.outcome = OutcomeHeldBytes
	st.releaseBody()
	return nil
}

// limitDetails is the details object of the answers that name a limit of
// the picker's own (held bytes, header bytes, open streams), in the shape
// of the queue limits' 429s.
type limitDetails struct {
	LimitKind string `json:"limit_kind"`
	Current   int64  `json:"current,omitempty"`
	Limit     int64  `json:"limit"`
	Requested int64  `json:"requested,omitempty"`
}

// sendHeadersTooLarge answers 431 headers_too_large: the header block has
// size bytes.
func (st *stream) sendHeadersTooLarge(size int) error {
	msg := fmt.Sprintf("request headers of %d bytes exceed the limit of %d bytes", size, st.s.maxHeader)
	body, _ := json.Marshal(struct {
		Error   string       `json:"error"`
		Details limitDetails `json:"details"`
	}{msg, limitDetails{LimitKind: "header_bytes", Limit: int64(st.s.maxHeader), Requested: int64(size)}}) // cannot fail
	if err := st.send(immediateResponse(http.StatusRequestHeaderFieldsTooLarge, OutcomeHeadersTooLarge, body, msg, 0)); err != nil {
		return err
	}
	st.answered = true
	st.outcome = OutcomeHeadersTooLarge
	return nil
}

// bodyTimeoutDetails is the details object of a 408 body_timeout answer.
type bodyTimeoutDetails struct {
	LimitKind      string  `json:"limit_kind"`
	LimitSeconds   float64 `json:"limit_seconds"`
	ReceivedBytes  int64   `json:"received_bytes"`
	AnnouncedBytes int64   `json:"announced_bytes,omitempty"`
}

// bodyTimedOut answers 408 body_timeout: the body deadline passed before
// the body's end. It runs on the clock's goroutine while the stream's own
// waits for a message, under the clock's lock (see bodyClock). Nothing
// more comes of the stream, so everything it holds goes back to the
// budget now, whether or not the gateway ends the stream.
func (st *stream) bodyTimedOut() {
	d := st.s.bodyTimeout
	received := int64(len(st.req.Body))
	msg := fmt.Sprintf("request body not received within the body timeout of %s: %d bytes arrived", d, received)
	if st.bodyHint > 0 {
		msg = fmt.Sprintf("request body not received within the body timeout of %s: %d of %d announced bytes arrived", d, received, st.bodyHint)
	}
	body, _ := json.Marshal(struct {
		Error   string             `json:"error"`
		Details bodyTimeoutDetails `json:"details"`
	}{msg, bodyTimeoutDetails{LimitKind: OutcomeBodyTimeout, LimitSeconds: d.Seconds(), ReceivedBytes: received, AnnouncedBytes: int64(st.bodyHint)}}) // cannot fail
	// Give the budget back before the answer leaves: once the gateway has
	// the 408 it may send the next request, which must find it there.
	st.releaseBody()
	st.releaseHeaders()
	st.req.Headers = nil
	if err := st.send(immediateResponse(http.StatusRequestTimeout, OutcomeBodyTimeout, body, msg, 0)); err == nil {
		st.answered = true
		st.outcome = OutcomeBodyTimeout
	}
	st.s.log.V(4).Info("request body timed out", "received", received, "announced", st.bodyHint)
}

func (st *stream) sendBodyTooLarge(n int) error {
	msg := fmt.Sprintf("request body of at least %d bytes exceeds the limit of %d bytes", n, st.s.maxBody)
	if err := st.send(immediateResponse(400, "body_too_large", nil, msg, 0)); err != nil {
		return err
	}
	st.answered = true
	st.outcome = OutcomeBodyTooLarge
	return nil
}

// sendDeciderError answers a failed decision: a Reply as the Decider asked,
// anything else as 503 with the error's message only.
func (st *stream) sendDeciderError(err error) error {
	var r *Reply
	outcome := OutcomeDeciderError
	var resp *extprocv3.ProcessingResponse
	if errors.As(err, &r) {
		outcome = r.Reason
		if outcome == "" {
			outcome = OutcomeRejected
		}
		resp = immediateResponse(r.Status, r.Reason, r.Body, r.Message, cmp.Or(r.RetryAfter, st.s.retryAfter))
	} else {
		st.s.log.V(2).Info("decider failed", "error", err.Error())
		resp = immediateResponse(503, "picker_error", nil, err.Error(), st.s.retryAfter)
	}
	if err := st.send(resp); err != nil {
		return err
	}
	st.answered = true
	st.outcome = outcome
	return nil
}
