package extproc

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Outcome labels passed to Observer.StreamDone. A stream answered with a
// Decider's Reply reports the Reply's Reason instead (or OutcomeRejected when
// the Reason is empty), so the label set is these constants plus the
// Decider's own small set of reason words.
const (
	// OutcomeRouted: the pick was sent to the gateway.
	OutcomeRouted = "routed"
	// OutcomeRejected: a Reply without a Reason was sent.
	OutcomeRejected = "rejected"
	// OutcomeBodyTooLarge: the request body exceeded Options.MaxBodyBytes (400).
	OutcomeBodyTooLarge = "body_too_large"
	// OutcomeHeldBytes: the request's headers or body would have passed
	// Options.MaxHeldBodyBytes (429 held_bytes).
	OutcomeHeldBytes = "held_bytes"
	// OutcomeHeadersTooLarge: the request headers exceeded
	// Options.MaxHeaderBytes (431).
	OutcomeHeadersTooLarge = "headers_too_large"
	// OutcomeBodyTimeout: the request body did not arrive within
	// Options.BodyTimeout (408).
	OutcomeBodyTimeout = "body_timeout"
	// OutcomeStreamLimit: Options.MaxStreams streams were open already
	// (429 stream_limit).
	OutcomeStreamLimit = "stream_limit"
	// OutcomeDeciderError: the Decider failed with an error that is not a
	// Reply (503).
	OutcomeDeciderError = "decider_error"
	// OutcomeClientGone: the gateway went away before an answer could be
	// sent.
	OutcomeClientGone = "client_gone"
	// OutcomeProtocolError: the gateway broke the protocol or asked for an
	// unsupported mode; the stream ended with a gRPC error.
	OutcomeProtocolError = "protocol_error"
	// OutcomePanic: handling the stream panicked; it was answered 500, or
	// ended with a gRPC error when its pick had already been sent.
	OutcomePanic = "panic"
)

// Observer receives one call per finished stream, e.g. to count outcomes in
// Prometheus. It is called on the stream's goroutine and must not block.
type Observer interface {
	StreamDone(outcome string)
}

// Options configures a Server. The zero value is usable.
type Options struct {
	// MaxBodyBytes bounds the request body; a larger body is answered with
	// 400. Zero means DefaultMaxBodyBytes.
	MaxBodyBytes int
	// MaxHeldBodyBytes bounds the request bytes held by all streams: the
	// header block of every open stream, and the body buffer of every
	// stream that has not yet passed its body back to the gateway (what
	// arrived, and at most bodySlice more, or twice what arrived; never
	// what content-length merely announces). A request that would pass it
	// is answered 429 held_bytes, at its headers or mid-body; bytes
	// already held are never given up for it. Zero means
	// DefaultMaxHeldBodyBytes.
	MaxHeldBodyBytes int64
	// MaxHeaderBytes bounds one request's header block (names and
	// values); a larger one is answered 431 headers_too_large without
	// being kept. Zero means DefaultMaxHeaderBytes.
	MaxHeaderBytes int
	// BodyTimeout bounds the arrival of a request body, from the request
	// headers to the body's last byte: a stream whose body has not
	// arrived by then is answered 408 body_timeout and lets go of what it
	// held, so a client that stalls cannot keep budget it does not use.
	// The wait in the queue is not part of it. Zero means
	// DefaultBodyTimeout; negative turns it off.
	BodyTimeout time.Duration
	// MaxStreams bounds the streams open at once: one more is answered
	// 429 stream_limit at its request headers. Every stream costs a
	// goroutine and its buffers besides the budget's bytes. Zero means
	// DefaultMaxStreams; negative turns it off.
	MaxStreams int
	// Logger receives per-stream diagnostics at verbosity 4 and protocol
	// errors at verbosity 2. The zero Logger discards.
	Logger logr.Logger
	// Observer, when set, is told each stream's outcome.
	Observer Observer
	// HeaderPickOnly puts only the pick (the first endpoint) in the
	// x-gateway-destination-endpoint header while the dynamic metadata keeps
	// the whole list. Envoy's ORIGINAL_DST cluster parses the header as one
	// ip:port and fails on a list, so set this when fallbacks are returned
	// to a gateway wired that way.
	HeaderPickOnly bool
	// ConformanceHooks honours the upstream conformance suite's hooks
	// (SPEC §7): request header test-epp-endpoint-selection fills
	// Request.TestEndpoints, and the response then carries
	// x-conformance-test-served-endpoint. Off, the header is ignored like
	// any unknown header: any client could send it to pin its request to
	// a pod of its choosing and learn pod addresses.
	ConformanceHooks bool
	// RetryAfter is the retry-after of every 429 and 503 whose Reply does
	// not carry its own (and of those the server answers itself). Zero
	// means DefaultRetryAfter.
	RetryAfter time.Duration
}

// DefaultMaxStreams is Options.MaxStreams' default. A stream costs the
// picker about 15 KiB besides its headers and body (its goroutine, gRPC's
// buffers, the stream's state; measured: 14 KiB per idle stream), so
// 20,000 open streams cost some 300 MiB: room for long queues with their
// responses streaming, and under the memory of a 1 GiB pod with its
// held-bytes budget.
const DefaultMaxStreams = 20_000

// DefaultRetryAfter is Options.RetryAfter's default: long enough that a
// client honouring it does not hammer an overloaded picker, short enough
// that a queue that drains in a moment is not left idle.
const DefaultRetryAfter = time.Second

// Server implements envoy.service.ext_proc.v3.ExternalProcessor. It is safe
// for concurrent use; every stream runs on its own gRPC goroutine and shares
// no mutable state with other streams.
type Server struct {
	decider        Decider
	maxBody        int
	maxHeader      int
	bodyTimeout    time.Duration // <= 0: off
	maxStreams     int64         // <= 0: none
	open           atomic.Int64  // streams in Process now
	held           budget
	log            logr.Logger
	obs            Observer
	headerPickOnly bool
	conformance    bool
	retryAfter     time.Duration

	// picks holds the pick answer for each single endpoint, the answer of
	// nearly every stream (no fallbacks, the body unchanged), built once
	// and shared by every stream routed there.
	picksMu sync.RWMutex
	picks   map[string]*extprocv3.ProcessingResponse
}

// preEncoded returns a message that marshals to exactly m's encoding, done
// once now: an empty ProcessingResponse carrying that encoding as its
// unknown fields, which protobuf writes out verbatim. Encoding the pick
// answer's metadata (two maps, walked by reflection) was the costliest
// part of marshalling it, and the gateway gets the same bytes. Only
// marshalling may read the result; it is m itself if m does not encode.
func preEncoded(m *extprocv3.ProcessingResponse) *extprocv3.ProcessingResponse {
	b, err := proto.Marshal(m)
	if err != nil {
		return m
	}
	e := &extprocv3.ProcessingResponse{}
	e.ProtoReflect().SetUnknown(b)
	return e
}

// maxCachedPicks bounds Server.picks: past it the cache starts over, so a
// pool whose endpoints come and go for months does not grow it forever.
const maxCachedPicks = 4096

// pickAnswer returns the shared pick answer for a request routed to the
// single endpoint pick (header and metadata both name just it), encoded
// once (see preEncoded).
func (s *Server) pickAnswer(pick string) *extprocv3.ProcessingResponse {
	s.picksMu.RLock()
	r := s.picks[pick]
	s.picksMu.RUnlock()
	if r != nil {
		return r
	}
	r = preEncoded(pickResponse(pick, pick, -1, nil, false))
	s.picksMu.Lock()
	if len(s.picks) >= maxCachedPicks {
		clear(s.picks)
	}
	s.picks[pick] = r
	s.picksMu.Unlock()
	return r
}

// NewServer returns a Server that asks d where each request goes.
func NewServer(d Decider, opts Options) *Server {
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.RetryAfter <= 0 {
		opts.RetryAfter = DefaultRetryAfter
	}
	if opts.MaxHeldBodyBytes <= 0 {
		opts.MaxHeldBodyBytes = DefaultMaxHeldBodyBytes
	}
	if opts.MaxHeaderBytes <= 0 {
		opts.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if opts.BodyTimeout == 0 {
		opts.BodyTimeout = DefaultBodyTimeout
	}
	if opts.MaxStreams == 0 {
		opts.MaxStreams = DefaultMaxStreams
	}
	return &Server{decider: d, maxBody: opts.MaxBodyBytes, maxHeader: opts.MaxHeaderBytes, bodyTimeout: opts.BodyTimeout,
		maxStreams: int64(opts.MaxStreams), held: budget{limit: opts.MaxHeldBodyBytes},
		log: opts.Logger, obs: opts.Observer, headerPickOnly: opts.HeaderPickOnly,
		conformance: opts.ConformanceHooks, retryAfter: opts.RetryAfter, picks: map[string]*extprocv3.ProcessingResponse{}}
}

// HeldBodyBytes returns the request body bytes the streams hold now (see
// Options.MaxHeldBodyBytes), with the copies reserved through
// ReserveHeldBodyBytes.
func (s *Server) HeldBodyBytes() int64 { return s.held.held.Load() - s.held.hdr.Load() }

// HeldHeaderBytes returns the request header bytes the open streams hold
// now, the other part of the budget.
func (s *Server) HeldHeaderBytes() int64 { return s.held.hdr.Load() }

// MaxHeldBodyBytes returns the limit of HeldBodyBytes and HeldHeaderBytes
// together.
func (s *Server) MaxHeldBodyBytes() int64 { return s.held.limit }

// OpenStreams returns the streams open now (see Options.MaxStreams).
func (s *Server) OpenStreams() int64 { return s.open.Load() }

// ReserveHeldBodyBytes takes n bytes of the held-body budget for a layer
// in front of the Server that keeps its own copy of request bytes while a
// stream is unanswered (the HA follower's replay copy), so that the copy
// counts against the same memory budget as the bodies the Server holds. It
// reports false, taking nothing, when n does not fit; the caller must then
// not keep the copy. Bytes taken are given back with ReleaseHeldBodyBytes.
func (s *Server) ReserveHeldBodyBytes(n int64) bool {
	_, ok := s.held.reserve(n)
	return ok
}

// ReleaseHeldBodyBytes gives back n bytes taken by ReserveHeldBodyBytes.
func (s *Server) ReleaseHeldBodyBytes(n int64) { s.held.release(n) }

// Register adds the ExternalProcessor service to a gRPC server.
func (s *Server) Register(r grpc.ServiceRegistrar) {
	extprocv3.RegisterExternalProcessorServer(r, s)
}

// ServiceName is the fully qualified gRPC service name, which is also the
// health-check service name Envoy probes (SPEC §7).
const ServiceName = "envoy.service.ext_proc.v3.ExternalProcessor"

// Process handles one ext_proc stream, i.e. one HTTP request, from request
// headers to the end of the response. It returns nil when the gateway ends the
// stream (also by cancelling it) and a gRPC status error on protocol
// violations.
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	n := s.open.Add(1)
	defer s.open.Add(-1)
	if s.maxStreams > 0 && n > s.maxStreams {
		return s.refuseStream(srv, n-1)
	}
	st := stream{s: s, srv: srv, ctx: srv.Context(), outcome: OutcomeClientGone}
	err := st.runContained()
	st.stopBodyClock()
	st.releaseBody()
	st.releaseHeaders()
	st.finish()
	if s.obs != nil {
		s.obs.StreamDone(st.outcome)
	}
	return err
}

// refuseStream answers a stream past Options.MaxStreams 429 stream_limit
// at its first message (the gateway expects an answer to the request
// headers), without reading the request: open streams were open when it
// came.
func (s *Server) refuseStream(srv extprocv3.ExternalProcessor_ProcessServer, open int64) error {
	outcome := OutcomeClientGone
	defer func() {
		if s.obs != nil {
			s.obs.StreamDone(outcome)
		}
	}()
	if _, err := srv.Recv(); err != nil {
		return nil
	}
	msg := fmt.Sprintf("the endpoint picker has %d streams open, the limit", open)
	body, _ := json.Marshal(struct {
		Error   string       `json:"error"`
		Details limitDetails `json:"details"`
	}{msg, limitDetails{LimitKind: "streams", Current: open, Limit: s.maxStreams}}) // cannot fail
	if err := srv.Send(immediateResponse(http.StatusTooManyRequests, OutcomeStreamLimit, body, msg, s.retryAfter)); err != nil {
		return nil
	}
	outcome = OutcomeStreamLimit
	return nil
}

// recvDone reports whether a Recv error is the gateway ending the stream
// rather than a failure worth reporting.
func recvDone(err error) bool {
	if errors.Is(err, io.EOF) {
		return true
	}
	switch status.Code(err) {
	case codes.Canceled, codes.DeadlineExceeded:
		return true
	}
	return false
}
