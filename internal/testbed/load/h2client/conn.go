package h2client

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/encoding/protowire"
)

// processPath is the ext_proc method every stream calls.
const processPath = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"

// Receive windows granted to the picker. Large and static, as Envoy grants
// by default, so the picker is never window-bound and no refill frames are
// needed in a run of small messages.
const (
	streamRecvWindow = 1 << 24
	connRecvWindow   = 1 << 30
	defaultWindow    = 65_535 // RFC 9113 initial windows
	defaultMaxFrame  = 16_384
)

// ErrClosed is the error of streams still open when Close is called.
var ErrClosed = errors.New("h2client: connection closed")

// Decision is the picker's answer to one stream's request phase.
type Decision struct {
	// Latency is the decision latency of SPEC §13.
	Latency time.Duration
	// Status is 0 for a routed request, otherwise the HTTP status of the
	// immediate response.
	Status int
	// Wire, with Options.WireStamps, is the latency to the kernel's receive
	// timestamp of the answer instead of to the reader handling it: the
	// picker and the loopback hop without the load tool's own wake-up. It is
	// an upper bound of that time (see rxStampConn); 0 when not measured.
	Wire time.Duration
}

// Options configure a connection.
type Options struct {
	// Plan is what every stream plays; required unless PlanOf is set.
	Plan *Plan
	// PlanOf, when set, chooses each stream's plan by its tag instead, for
	// runs whose requests must differ (distinct prompts, as a prefix
	// cache sees real traffic); it is called once per stream, by Start.
	PlanOf func(tag int) *Plan
	// Hold is how long a routed stream waits before its response phases.
	Hold time.Duration
	// TLS, when set, speaks TLS (ALPN h2); nil speaks cleartext HTTP/2.
	TLS *tls.Config
	// OnDecision is called once per stream that got an answer to its
	// request phase. OnDone is called exactly once per started stream, with
	// nil when the exchange completed. Both run on the connection's reader
	// goroutine (OnDone also on the caller's, when Start fails at once, and
	// on Close's) and must be quick; they may call Start.
	OnDecision func(tag int, d Decision)
	OnDone     func(tag int, err error)
	// WireStamps asks the kernel for receive timestamps (Linux) so every
	// Decision also carries Wire.
	WireStamps bool
}

// stream states, in protocol order.
const (
	sRequest     = iota // request phase sent, waiting for the decision
	sHeld               // routed, waiting out the hold
	sRespHeaders        // response headers sent, waiting for their answer
	sRespBody           // response body sent, waiting for its answers
	sClosing            // END_STREAM sent, waiting for the trailers
	sImmediate          // answered directly, waiting for the trailers
)

var stateNames = [...]string{"request", "held", "response headers", "response body", "closing", "immediate"}

type stream struct {
	id    uint32
	tag   int
	state int
	plan  *Plan

	startedAt time.Duration // since Conn.epoch
	sentAt    atomic.Int64  // since Conn.epoch, when the last request byte was written; 0 before
	due       time.Duration // end of the hold, since Conn.epoch

	pend       []byte // data not yet framed (flow control)
	pendEnd    bool   // END_STREAM after pend
	stampAfter bool   // stamp sentAt when pend drains into a write
	blocked    bool   // on Conn.blocked
	sendWin    int64
	localEnd   bool // END_STREAM sent

	rbuf        []byte // a partial gRPC message
	recvUnacked int
	respAnswers int
}

// Conn is one HTTP/2 connection to a picker carrying many ext_proc streams.
type Conn struct {
	nc    net.Conn
	opts  Options
	epoch time.Time
	rx    *rxStampConn // nil without Options.WireStamps
	block []byte       // the request HEADERS block, the same for every stream

	mu         sync.Mutex // guards everything below, and wfr
	wfr        *http2.Framer
	wbuf       []byte
	stamp      []*stream
	streams    map[uint32]*stream
	nextID     uint32
	connWin    int64
	peerWin    int64
	maxFrame   int
	maxStreams uint32
	blocked    []*stream
	err        error
	goAway     bool

	wake     chan struct{}
	holdMu   sync.Mutex
	holdQ    []*stream
	holdWake chan struct{}
	done     chan struct{}
	wg       sync.WaitGroup

	// Reader goroutine only.
	recvUnacked int
	events      []event
}

type event struct {
	tag      int
	decision bool
	d        Decision
	err      error
}

// appendWriter lets the write framer encode straight into Conn.wbuf.
type appendWriter struct{ c *Conn }

func (w appendWriter) Write(p []byte) (int, error) {
	w.c.wbuf = append(w.c.wbuf, p...)
	return len(p), nil
}

// Dial connects to addr and starts the connection's goroutines.
func Dial(ctx context.Context, addr string, o Options) (*Conn, error) {
	if (o.Plan == nil && o.PlanOf == nil) || o.OnDone == nil {
		return nil, errors.New("h2client: Options.Plan (or PlanOf) and OnDone are required")
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	var rx *rxStampConn
	if tc, ok := nc.(*net.TCPConn); ok && o.WireStamps {
		if rx, err = newRxStampConn(tc); err != nil {
			nc.Close()
			return nil, fmt.Errorf("receive timestamps on %s: %w", addr, err)
		}
		if rx != nil {
			nc = rx
		}
	}
	scheme := "http"
	if o.TLS != nil {
		cfg := o.TLS.Clone()
		cfg.NextProtos = []string{"h2"}
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, fmt.Errorf("TLS handshake with %s: %w", addr, err)
		}
		if p := tc.ConnectionState().NegotiatedProtocol; p != "h2" {
			tc.Close()
			return nil, fmt.Errorf("%s negotiated ALPN %q, not h2", addr, p)
		}
		nc, scheme = tc, "https"
	}
	c := &Conn{
		nc: nc, opts: o, epoch: time.Now(), rx: rx,
		streams: map[uint32]*stream{}, nextID: 1,
		connWin: defaultWindow, peerWin: defaultWindow, maxFrame: defaultMaxFrame, maxStreams: 1<<31 - 1,
		wake: make(chan struct{}, 1), holdWake: make(chan struct{}, 1), done: make(chan struct{}),
	}
	c.block = headerBlock(scheme, addr)
	c.wfr = http2.NewFramer(appendWriter{c}, nil)
	c.wbuf = append(c.wbuf, http2.ClientPreface...)
	err = errors.Join(
		c.wfr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 0},
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: streamRecvWindow}),
		c.wfr.WriteWindowUpdate(0, connRecvWindow-defaultWindow))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("encode the connection preface: %w", err)
	}
	c.wg.Add(3)
	go c.writeLoop()
	go c.readLoop()
	go c.holdLoop()
	c.kick()
	return c, nil
}

// headerBlock encodes the request headers of a Process call. The encoder's
// dynamic table is sized 0, so the block never refers to earlier ones and
// can be sent unchanged on every stream.
func headerBlock(scheme, authority string) []byte {
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	enc.SetMaxDynamicTableSize(0)
	for _, f := range []hpack.HeaderField{
		{Name: ":method", Value: "POST"},
		{Name: ":scheme", Value: scheme},
		{Name: ":path", Value: processPath},
		{Name: ":authority", Value: authority},
		{Name: "content-type", Value: "application/grpc"},
		{Name: "te", Value: "trailers"},
		{Name: "user-agent", Value: "laneway-loadgen"},
	} {
		_ = enc.WriteField(f) // writes to a bytes.Buffer cannot fail
	}
	return buf.Bytes()
}

func (c *Conn) now() time.Duration { return time.Since(c.epoch) }

func (c *Conn) kick() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Start opens a stream tagged tag and sends its request phase. Its outcome
// arrives through OnDecision and OnDone.
func (c *Conn) Start(tag int) {
	plan := c.opts.Plan
	if c.opts.PlanOf != nil {
		plan = c.opts.PlanOf(tag) // before the lock: it may encode
	}
	c.mu.Lock()
	var err error
	switch {
	case c.err != nil:
		err = c.err
	case c.goAway:
		err = errors.New("h2client: the picker sent GOAWAY")
	case uint32(len(c.streams)) >= c.maxStreams:
		err = fmt.Errorf("h2client: the picker allows %d concurrent streams", c.maxStreams)
	case c.nextID > 1<<31-1:
		err = errors.New("h2client: stream ids exhausted; dial a new connection")
	}
	if err != nil {
		c.mu.Unlock()
		c.opts.OnDone(tag, err)
		return
	}
	s := &stream{id: c.nextID, tag: tag, state: sRequest, plan: plan, sendWin: c.peerWin, startedAt: c.now(), stampAfter: true}
	c.nextID += 2
	c.streams[s.id] = s
	err = c.wfr.WriteHeaders(http2.HeadersFrameParam{StreamID: s.id, BlockFragment: c.block, EndHeaders: true})
	if err == nil {
		// A header-only stream half-closes with its request.
		c.send(s, s.plan.request, s.plan.headerOnly)
	}
	if err == nil {
		err = c.err // a DATA frame failed to encode
	}
	c.mu.Unlock()
	if err != nil {
		c.fail(fmt.Errorf("stream %d: %w", s.id, err))
		return
	}
	c.kick()
}

// send queues data (and END_STREAM) on s and frames what the windows
// allow. c.mu is held.
func (c *Conn) send(s *stream, data []byte, end bool) {
	if len(s.pend) == 0 {
		s.pend = data // shared, read-only plan bytes: no copy
	} else {
		s.pend = append(s.pend[:len(s.pend):len(s.pend)], data...)
	}
	s.pendEnd = s.pendEnd || end
	c.pump(s)
}

// pump frames s's pending data within the flow-control windows. c.mu is
// held.
func (c *Conn) pump(s *stream) {
	for len(s.pend) > 0 {
		n := min(int64(len(s.pend)), int64(c.maxFrame), c.connWin, s.sendWin)
		if n <= 0 {
			if !s.blocked {
				s.blocked = true
				c.blocked = append(c.blocked, s)
			}
			return
		}
		last := n == int64(len(s.pend))
		if err := c.wfr.WriteData(s.id, last && s.pendEnd, s.pend[:n]); err != nil {
			c.err = fmt.Errorf("encode DATA: %w", err)
			return
		}
		c.connWin -= n
		s.sendWin -= n
		s.pend = s.pend[n:]
		if last && s.pendEnd {
			s.localEnd = true
		}
	}
	if s.pendEnd && !s.localEnd {
		_ = c.wfr.WriteData(s.id, true, nil) // an empty END_STREAM needs no window
		s.localEnd = true
	}
	s.pend = nil
	if s.stampAfter {
		s.stampAfter = false
		c.stamp = append(c.stamp, s)
	}
}

// unblock retries streams that waited for window. c.mu is held.
func (c *Conn) unblock() {
	waiting := c.blocked
	c.blocked = nil
	for _, s := range waiting {
		s.blocked = false
		if _, open := c.streams[s.id]; open {
			c.pump(s)
		}
	}
}

// writeLoop writes everything queued since its last write in one call.
func (c *Conn) writeLoop() {
	defer c.wg.Done()
	var spare []byte
	var spareStamp []*stream
	for {
		select {
		case <-c.wake:
		case <-c.done:
			return
		}
		c.mu.Lock()
		buf, stamp := c.wbuf, c.stamp
		c.wbuf, c.stamp = spare[:0], spareStamp[:0]
		c.mu.Unlock()
		if len(buf) == 0 {
			spare, spareStamp = buf, stamp
			continue
		}
		now := int64(c.now())
		for _, s := range stamp {
			s.sentAt.Store(now)
		}
		if _, err := c.nc.Write(buf); err != nil {
			c.fail(fmt.Errorf("write: %w", err))
			return
		}
		clear(stamp)
		spare, spareStamp = buf, stamp
	}
}

// holdLoop starts the response phase of routed streams once their hold is
// over. Holds are all the same length, so a FIFO is in due order.
func (c *Conn) holdLoop() {
	defer c.wg.Done()
	t := time.NewTimer(time.Hour)
	t.Stop()
	for {
		c.holdMu.Lock()
		if len(c.holdQ) == 0 {
			c.holdMu.Unlock()
			select {
			case <-c.holdWake:
				continue
			case <-c.done:
				return
			}
		}
		now := c.now()
		if wait := c.holdQ[0].due - now; wait > 0 {
			c.holdMu.Unlock()
			t.Reset(wait)
			select {
			case <-t.C:
			case <-c.holdWake: // only ever appends later dues; re-check anyway
				t.Stop()
			case <-c.done:
				return
			}
			continue
		}
		i := 0
		for i < len(c.holdQ) && c.holdQ[i].due <= now {
			i++
		}
		due := make([]*stream, i)
		copy(due, c.holdQ[:i])
		c.holdQ = append(c.holdQ[:0], c.holdQ[i:]...)
		c.holdMu.Unlock()

		c.mu.Lock()
		for _, s := range due {
			if _, open := c.streams[s.id]; open && s.state == sHeld {
				c.respond(s)
			}
		}
		c.mu.Unlock()
		c.kick()
	}
}

// respond plays s's upstream response: headers and body together, as Envoy
// does in FULL_DUPLEX_STREAMED mode, where body chunks go to the processor
// without waiting for the headers' answer. c.mu is held.
func (c *Conn) respond(s *stream) {
	s.state = sRespHeaders
	c.send(s, s.plan.response, false)
}

// readLoop reads frames and runs every stream's protocol state.
func (c *Conn) readLoop() {
	defer c.wg.Done()
	fr := http2.NewFramer(nil, bufio.NewReaderSize(c.nc, 64<<10))
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) {
				c.mu.Lock()
				if s := c.streams[se.StreamID]; s != nil {
					c.reset(s, se.Code, fmt.Errorf("stream %d: %w", se.StreamID, err))
				}
				c.mu.Unlock()
				c.kick() // the RST_STREAM
				c.flushEvents()
				continue
			}
			c.fail(fmt.Errorf("read: %w", err))
			return
		}
		c.mu.Lock()
		if c.err == nil {
			c.handle(f)
		}
		err = c.err
		c.mu.Unlock()
		c.kick()
		c.flushEvents()
		if err != nil {
			c.fail(err)
			return
		}
	}
}

func (c *Conn) flushEvents() {
	for i, ev := range c.events {
		if ev.decision {
			if c.opts.OnDecision != nil {
				c.opts.OnDecision(ev.tag, ev.d)
			}
		} else {
			c.opts.OnDone(ev.tag, ev.err)
		}
		c.events[i] = event{}
	}
	c.events = c.events[:0]
}

// handle applies one frame. c.mu is held.
func (c *Conn) handle(f http2.Frame) {
	switch f := f.(type) {
	case *http2.DataFrame:
		n := int(f.Header().Length)
		c.recvUnacked += n
		if c.recvUnacked >= connRecvWindow/2 {
			_ = c.wfr.WriteWindowUpdate(0, uint32(c.recvUnacked))
			c.recvUnacked = 0
		}
		s := c.streams[f.StreamID]
		if s == nil {
			return // already finished or reset: late data is dropped
		}
		if s.recvUnacked += n; s.recvUnacked >= streamRecvWindow/2 {
			_ = c.wfr.WriteWindowUpdate(s.id, uint32(s.recvUnacked))
			s.recvUnacked = 0
		}
		if err := c.onData(s, f.Data()); err != nil {
			c.reset(s, http2.ErrCodeProtocol, err)
			return
		}
		if f.StreamEnded() {
			c.reset(s, http2.ErrCodeProtocol, errors.New("the picker ended the stream without trailers"))
		}
	case *http2.MetaHeadersFrame:
		if s := c.streams[f.StreamID]; s != nil {
			c.onHeaders(s, f)
		}
	case *http2.SettingsFrame:
		if f.IsAck() {
			return
		}
		err := f.ForeachSetting(func(st http2.Setting) error {
			switch st.ID {
			case http2.SettingInitialWindowSize:
				delta := int64(st.Val) - c.peerWin
				c.peerWin = int64(st.Val)
				for _, s := range c.streams {
					s.sendWin += delta
				}
			case http2.SettingMaxFrameSize:
				c.maxFrame = int(st.Val)
			case http2.SettingMaxConcurrentStreams:
				c.maxStreams = st.Val
			}
			return nil
		})
		if err == nil {
			err = c.wfr.WriteSettingsAck()
		}
		if err != nil {
			c.err = fmt.Errorf("SETTINGS: %w", err)
			return
		}
		c.unblock()
	case *http2.WindowUpdateFrame:
		if f.StreamID == 0 {
			c.connWin += int64(f.Increment)
		} else if s := c.streams[f.StreamID]; s != nil {
			s.sendWin += int64(f.Increment)
		}
		c.unblock()
	case *http2.PingFrame:
		if !f.IsAck() {
			_ = c.wfr.WritePing(true, f.Data)
		}
	case *http2.RSTStreamFrame:
		if s := c.streams[f.StreamID]; s != nil {
			c.finish(s, fmt.Errorf("the picker reset the stream in state %s: %v", stateNames[s.state], f.ErrCode))
		}
	case *http2.GoAwayFrame:
		c.goAway = true
		for id, s := range c.streams {
			if id > f.LastStreamID {
				c.finish(s, fmt.Errorf("the picker sent GOAWAY (%v) before stream %d", f.ErrCode, id))
			}
		}
	}
}

// onData splits s's DATA into gRPC messages, copying only a message that
// spans frames.
func (c *Conn) onData(s *stream, data []byte) error {
	if len(s.rbuf) > 0 {
		s.rbuf = append(s.rbuf, data...)
		data = s.rbuf
	}
	for len(data) >= 5 {
		if data[0] != 0 {
			return errors.New("compressed gRPC message: not negotiated")
		}
		n := int(binary.BigEndian.Uint32(data[1:5]))
		if len(data) < 5+n {
			break
		}
		if err := c.onMessage(s, data[5:5+n]); err != nil {
			return err
		}
		data = data[5+n:]
	}
	s.rbuf = append(s.rbuf[:0], data...)
	return nil
}

// ProcessingResponse field numbers (envoy.service.ext_proc.v3).
const (
	fieldRequestHeaders   = 1
	fieldResponseHeaders  = 2
	fieldRequestBody      = 3
	fieldResponseBody     = 4
	fieldRequestTrailers  = 5
	fieldResponseTrailers = 6
	fieldImmediate        = 7
	// fieldStreamedImmediate is streamed_immediate_response, a local
	// response the processor streams; pickers do not send it, and the load
	// tool reports it as unexpected.
	fieldStreamedImmediate = 11
)

// isResponseField reports whether num is a member of ProcessingResponse's
// response oneof.
func isResponseField(num protowire.Number) bool {
	return num >= fieldRequestHeaders && num <= fieldImmediate || num == fieldStreamedImmediate
}

// onMessage advances s on one ProcessingResponse.
func (c *Conn) onMessage(s *stream, msg []byte) error {
	field, val, err := responseKind(msg)
	if err != nil {
		return err
	}
	switch field {
	case fieldImmediate:
		if s.state != sRequest {
			return fmt.Errorf("immediate response in state %s", stateNames[s.state])
		}
		status, err := immediateStatus(val)
		if err != nil {
			return err
		}
		s.state = sImmediate
		c.decided(s, status)
	case fieldRequestHeaders:
		if s.state != sRequest {
			return fmt.Errorf("request headers answered in state %s", stateNames[s.state])
		}
		c.decided(s, 0)
		if s.plan.headerOnly {
			// Nothing more to send: the picker ends the stream (after
			// streaming the body back).
			s.state = sClosing
			return nil
		}
		s.state = sHeld
		if c.opts.Hold <= 0 {
			c.respond(s)
			return nil
		}
		s.due = c.now() + c.opts.Hold
		c.holdMu.Lock()
		c.holdQ = append(c.holdQ, s)
		c.holdMu.Unlock()
		select {
		case c.holdWake <- struct{}{}:
		default:
		}
	case fieldRequestBody, fieldRequestTrailers:
		// The request body streamed back to the upstream: nothing to do.
	case fieldResponseHeaders:
		if s.state != sRespHeaders {
			return fmt.Errorf("response headers answered in state %s", stateNames[s.state])
		}
		s.state = sRespBody // the body went out with the headers
	case fieldResponseBody:
		if s.state != sRespBody {
			return fmt.Errorf("response body answered in state %s", stateNames[s.state])
		}
		if s.respAnswers++; s.respAnswers == s.plan.respBodyMsgs {
			s.state = sClosing
			c.send(s, nil, true)
		}
	default:
		return fmt.Errorf("unexpected ProcessingResponse field %d", field)
	}
	return nil
}

func (c *Conn) decided(s *stream, status int) {
	from := time.Duration(s.sentAt.Load())
	if from == 0 {
		from = s.startedAt // answered before the request went out whole
	}
	d := Decision{Latency: c.now() - from, Status: status}
	if c.rx != nil {
		if at := c.rx.last.Load(); at != 0 {
			// The kernel stamps with the wall clock, Latency is monotonic:
			// keep Wire within (0, Latency] should the two drift apart.
			d.Wire = min(max(time.Duration(at-c.epoch.UnixNano())-from, 1), d.Latency)
		}
	}
	c.events = append(c.events, event{tag: s.tag, decision: true, d: d})
}

// onHeaders takes the response headers or the trailers of s.
func (c *Conn) onHeaders(s *stream, f *http2.MetaHeadersFrame) {
	if !f.StreamEnded() {
		if st := f.PseudoValue("status"); st != "200" {
			c.reset(s, http2.ErrCodeProtocol, fmt.Errorf("HTTP status %q from the picker", st))
		}
		return
	}
	code, msg := f.PseudoValue("status"), ""
	for _, hf := range f.RegularFields() {
		switch hf.Name {
		case "grpc-status":
			code = hf.Value
		case "grpc-message":
			msg = hf.Value
		}
	}
	switch {
	case code != "0":
		c.reset(s, http2.ErrCodeCancel, fmt.Errorf("grpc-status %s %q in state %s", code, msg, stateNames[s.state]))
	case s.state == sImmediate || s.state == sClosing ||
		s.state == sRespBody && s.respAnswers == s.plan.respBodyMsgs:
		if !s.localEnd {
			_ = c.wfr.WriteRSTStream(s.id, http2.ErrCodeNo) // close our half too
		}
		c.finish(s, nil)
	default:
		c.reset(s, http2.ErrCodeCancel, fmt.Errorf("the picker ended the stream in state %s", stateNames[s.state]))
	}
}

// reset ends s from our side with code and reports err. c.mu is held.
func (c *Conn) reset(s *stream, code http2.ErrCode, err error) {
	_ = c.wfr.WriteRSTStream(s.id, code)
	c.finish(s, err)
}

// finish removes s and queues its OnDone. c.mu is held.
func (c *Conn) finish(s *stream, err error) {
	delete(c.streams, s.id)
	s.pend = nil
	c.events = append(c.events, event{tag: s.tag, err: err})
}

// fail ends the connection: every open stream is done with err.
func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.err != nil && c.streams == nil {
		c.mu.Unlock()
		return
	}
	if c.err == nil {
		c.err = err
	}
	open := c.streams
	c.streams = nil
	c.mu.Unlock()
	select {
	case <-c.done:
	default:
		close(c.done)
	}
	c.nc.Close()
	for _, s := range open {
		c.opts.OnDone(s.tag, fmt.Errorf("stream %d in state %s: %w", s.id, stateNames[s.state], err))
	}
}

// Close ends the connection; streams still open are done with ErrClosed.
// It waits for the connection's goroutines.
func (c *Conn) Close() error {
	c.fail(ErrClosed)
	c.wg.Wait()
	return nil
}

// responseKind finds which response a ProcessingResponse carries.
func responseKind(msg []byte) (protowire.Number, []byte, error) {
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return 0, nil, fmt.Errorf("ProcessingResponse: %w", protowire.ParseError(n))
		}
		msg = msg[n:]
		if isResponseField(num) && typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(msg)
			if m < 0 {
				return 0, nil, fmt.Errorf("ProcessingResponse field %d: %w", num, protowire.ParseError(m))
			}
			return num, v, nil
		}
		m := protowire.ConsumeFieldValue(num, typ, msg)
		if m < 0 {
			return 0, nil, fmt.Errorf("ProcessingResponse field %d: %w", num, protowire.ParseError(m))
		}
		msg = msg[m:]
	}
	return 0, nil, errors.New("ProcessingResponse carries no response")
}

// immediateStatus reads ImmediateResponse.status.code (field 1 of field 1).
func immediateStatus(ir []byte) (int, error) {
	status, err := field(ir, 1, protowire.BytesType)
	if err != nil {
		return 0, fmt.Errorf("ImmediateResponse.status: %w", err)
	}
	code, err := field(status, 1, protowire.VarintType)
	if err != nil {
		return 0, fmt.Errorf("ImmediateResponse.status.code: %w", err)
	}
	v, n := protowire.ConsumeVarint(code)
	if n < 0 {
		return 0, fmt.Errorf("ImmediateResponse.status.code: %w", protowire.ParseError(n))
	}
	return int(v), nil
}

// field returns the raw value of the first field num of type typ in msg.
func field(msg []byte, num protowire.Number, typ protowire.Type) ([]byte, error) {
	for len(msg) > 0 {
		gotNum, gotTyp, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		msg = msg[n:]
		m := protowire.ConsumeFieldValue(gotNum, gotTyp, msg)
		if m < 0 {
			return nil, protowire.ParseError(m)
		}
		if gotNum == num && gotTyp == typ {
			if typ == protowire.BytesType {
				v, _ := protowire.ConsumeBytes(msg)
				return v, nil
			}
			return msg[:m], nil
		}
		msg = msg[m:]
	}
	return nil, errors.New("field " + strconv.Itoa(int(num)) + " missing")
}
