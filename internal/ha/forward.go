package ha

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/laneway-dev/laneway/pkg/extproc"
)

// Router is the ext_proc service on the picker's gRPC server: it decides,
// per stream, whether the replica's own handler serves it or the leader
// does. Until Follow (without leader election, always) every stream is
// served here; after it, the streams of a follower go to the leader.
type Router struct {
	extprocv3.UnimplementedExternalProcessorServer
	local Local
	fwd   atomic.Pointer[forwarder]
}

// Local is the replica's own ext_proc handler as the router uses it
// (extproc.Server): it serves streams, and its held-body budget also
// counts the copies a follower keeps of the streams it forwards.
type Local interface {
	Process(extprocv3.ExternalProcessor_ProcessServer) error
	ReserveHeldBodyBytes(n int64) bool
	ReleaseHeldBodyBytes(n int64)
}

// NewRouter returns a router that serves every stream with local.
func NewRouter(local Local) *Router { return &Router{local: local} }

// Process implements extprocv3.ExternalProcessorServer.
func (r *Router) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	if f := r.fwd.Load(); f != nil {
		return f.process(srv)
	}
	return r.local.Process(srv)
}

// FollowConfig configures Router.Follow.
type FollowConfig struct {
	// Leader says who leads (the Elector).
	Leader LeaderView
	// Self is this replica's holder identity (Identity): the leader learns
	// from it that a stream was forwarded.
	Self string
	// Gate is the local handler's readiness gate: while it gives a reason
	// the replica does not forward either (its handler answers 503).
	Gate func() string
	// Refusals are the x-laneway-reason values of a 503 by which a
	// replica says only that it cannot schedule now (not ready, policy
	// invalid, shutting down): a leader's first answer with one is not
	// the client's, and the stream is replayed here.
	Refusals []string
	// Link is how the leader is dialled.
	Link LinkOptions
	// Registry gets laneway_ha_streams_total.
	Registry prometheus.Registerer
	Log      logr.Logger
}

// Follow makes the router route each later stream by cfg.Leader: served
// here while this replica leads, forwarded to the leader otherwise, and
// served here while no leader is reachable.
func (r *Router) Follow(cfg FollowConfig) error {
	f, err := newForwarder(cfg, r.local)
	if err != nil {
		return err
	}
	r.fwd.Store(f)
	return nil
}

// Close closes the connection to the leader; call it once the gRPC server
// stopped (the streams on it are over).
func (r *Router) Close() {
	if f := r.fwd.Load(); f != nil {
		f.close()
	}
}

// forwardedByKey is the gRPC metadata a follower sets on a stream it
// forwards: its holder identity. A replica never forwards such a stream
// again (it schedules it here), so two replicas with crossed views of the
// Lease cannot bounce a stream between them.
const forwardedByKey = "x-laneway-forwarded-by"

// The HA series, registered only with --ha-enable-leader-election.
const (
	MetricLeader  = "laneway_ha_leader"
	MetricStreams = "laneway_ha_streams_total"
)

// Routes of laneway_ha_streams_total.
const (
	routeLeader    = "leader"    // scheduled here, this replica holds the Lease
	routeForwarded = "forwarded" // proxied to the leader
	routeLocal     = "local"     // handled here: no reachable leader (unknown, stale, not connected), forwarded to us, or this replica's own 503 (not ready)
	routeFallback  = "fallback"  // the leader failed or refused before answering; replayed and scheduled here
)

// replayLimit bounds the request messages a follower keeps per forwarded
// stream until the leader's first answer, to replay them locally when the
// leader fails or refuses before answering. A larger request is still
// forwarded, but a leader failure before its answer then ends the stream
// with Unavailable instead of a local decision. The kept bytes also count
// against the replica's held-body budget (--max-held-body-bytes): they are
// request bytes held for a stream not answered yet, and a follower in front
// of a saturated leader holds one copy per queued stream. A copy the budget
// cannot take is not kept, with the same consequence as a large request:
// the stream is forwarded all the same, never refused for it.
const replayLimit = 1 << 20

// heldBudget is the replica's held-body budget, as the forwarder uses it
// for its replay copies (extproc.Server implements it).
type heldBudget interface {
	ReserveHeldBodyBytes(n int64) bool
	ReleaseHeldBodyBytes(n int64)
}

// LeaderView is what the router needs from the elector (Elector).
type LeaderView interface {
	// IsLeader reports whether this replica leads.
	IsLeader() bool
	// Leader returns the holder identity of a leader to forward to, ""
	// when there is none (this replica leads, or no fresh holder is
	// known).
	Leader() string
}

// forwarder is the follower side of HA: each ext_proc stream goes to the
// leader as a transparent proxy, so the leader's one queue orders all of
// the pool's requests; when no leader is reachable the stream is
// scheduled here.
type forwarder struct {
	view     LeaderView
	self     string // this replica's holder identity
	local    Local
	gate     func() string
	refusals []string
	dialTo   func(holder string) (*grpc.ClientConn, error)
	// ownPin is the pin of the replicas' serving certificate with mutual
	// TLS, "" without it: who may mark a stream forwarded (peerMarked).
	ownPin func() string
	log    logr.Logger
	// routes counts the streams by route (laneway_ha_streams_total), its
	// children resolved once: every stream counts one.
	routes map[string]prometheus.Counter

	mu  sync.Mutex
	cur *leaderConn // the connection to the leader last forwarded to
	bad string      // a holder that could not be dialled (logged once)
}

// leaderConn is a connection to one leader, closed once it is neither the
// current leader's nor used by a stream.
type leaderConn struct {
	holder string
	conn   *grpc.ClientConn
	active int
	stale  bool
}

func newForwarder(cfg FollowConfig, local Local) (*forwarder, error) {
	routes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricStreams,
		Help: "ext_proc streams by where they were handled: leader (here, holding the Lease), forwarded (to the leader), local (here: no reachable leader, forwarded to us, or this replica not ready), fallback (the leader failed or refused before answering; replayed here).",
	}, []string{"route"})
	children := map[string]prometheus.Counter{}
	for _, r := range []string{routeLeader, routeForwarded, routeLocal, routeFallback} {
		children[r] = routes.WithLabelValues(r)
	}
	if err := cfg.Registry.Register(routes); err != nil {
		return nil, fmt.Errorf("register %s: %w", MetricStreams, err)
	}
	ownPin, err := replicaPin(cfg.Link)
	if err != nil {
		return nil, err
	}
	return &forwarder{view: cfg.Leader, self: cfg.Self, local: local, gate: cfg.Gate, refusals: cfg.Refusals,
		dialTo: dialer(cfg.Link), ownPin: ownPin, log: cfg.Log, routes: children}, nil
}

// process routes one stream.
func (f *forwarder) process(gw extprocv3.ExternalProcessor_ProcessServer) error {
	if f.view.IsLeader() {
		f.routes[routeLeader].Inc()
		return f.local.Process(gw)
	}
	holder := f.view.Leader()
	if holder == "" || f.gate() != "" || peerMarked(gw.Context(), f.ownPin) {
		// A closed gate answers 503 with its reason from the local
		// handler: a replica that must not schedule does not forward
		// either.
		f.routes[routeLocal].Inc()
		return f.local.Process(gw)
	}
	lc := f.acquire(holder)
	if lc == nil {
		f.routes[routeLocal].Inc()
		return f.local.Process(gw)
	}
	defer f.release(lc)
	f.routes[routeForwarded].Inc()
	return f.proxy(gw, lc)
}

func forwardedBy(ctx context.Context) string {
	if v := metadata.ValueFromIncomingContext(ctx, forwardedByKey); len(v) > 0 {
		return v[0]
	}
	return ""
}

// acquire returns the connection to holder for one stream, or nil when it
// is not connected yet (the stream is then scheduled here rather than made
// to wait for a dial that may not succeed; the connection is asked to
// connect for the next one).
func (f *forwarder) acquire(holder string) *leaderConn {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cur == nil || f.cur.holder != holder {
		if holder == f.bad {
			return nil
		}
		if f.cur != nil {
			f.cur.stale = true
			f.closeIfIdle(f.cur)
		}
		f.cur = nil
		conn, err := f.dialTo(holder)
		if err != nil {
			f.bad = holder
			f.log.Error(err, "cannot forward to the leader; scheduling here while it leads", "leader", holder)
			return nil
		}
		f.cur = &leaderConn{holder: holder, conn: conn}
		f.log.Info("forwarding streams to the leader", "leader", holder)
	}
	lc := f.cur
	if st := lc.conn.GetState(); st != connectivity.Ready {
		lc.conn.Connect()
		return nil
	}
	lc.active++
	return lc
}

func (f *forwarder) release(lc *leaderConn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	lc.active--
	f.closeIfIdle(lc)
}

func (f *forwarder) closeIfIdle(lc *leaderConn) {
	if lc.stale && lc.active == 0 {
		_ = lc.conn.Close()
	}
}

// close closes the current connection (the streams on it are over).
func (f *forwarder) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cur != nil {
		f.cur.stale = true
		f.closeIfIdle(f.cur)
		f.cur = nil
	}
}

// proxy plays one stream through the leader: the gateway's messages go
// up, the leader's answers come down, unchanged. Until the leader's first
// answer the gateway's messages are kept (up to replayLimit), so that a
// leader that fails, or refuses with a replica-local 503 (not_ready,
// policy_invalid, shutting_down), before answering costs nothing: the
// stream is replayed into the local handler.
func (f *forwarder) proxy(gw extprocv3.ExternalProcessor_ProcessServer, lc *leaderConn) error {
	ctx, cancel := context.WithCancel(gw.Context())
	defer cancel()
	upCtx := metadata.AppendToOutgoingContext(ctx, forwardedByKey, f.self)
	up, err := extprocv3.NewExternalProcessorClient(lc.conn).Process(upCtx)
	if err != nil {
		// Nothing of the gateway's stream has been read yet: the local
		// handler takes it as it is, with no pump to replay through.
		f.routes[routeFallback].Inc()
		f.log.V(3).Info("leader did not answer; scheduling the stream here", "leader", lc.holder, "error", err.Error())
		return f.local.Process(gw)
	}
	p := &pump{gw: gw, up: up, held: f.local, kept: true, rest: make(chan recvResult)}
	defer p.commit() // whatever way the stream ends, its copies go
	go p.run(cancel)
	first := true
	for {
		resp, err := up.Recv()
		if errors.Is(err, io.EOF) {
			return nil // the leader ended the stream: so does the gateway's
		}
		if err != nil {
			if gw.Context().Err() != nil {
				return gw.Context().Err() // the gateway went away first
			}
			if first {
				if replay, ok := p.divert(); ok {
					cancel()
					return f.replay(gw, lc, replay, err)
				}
			}
			return err // the leader's status, or Unavailable for a broken link
		}
		if first {
			if reason := localRefusal(resp, f.refusals); reason != "" {
				if replay, ok := p.divert(); ok {
					cancel()
					return f.replay(gw, lc, replay, fmt.Errorf("leader answered 503 %s", reason))
				}
			}
			first = false
			p.commit()
		}
		if err := gw.Send(resp); err != nil {
			return err
		}
	}
}

func (f *forwarder) replay(gw extprocv3.ExternalProcessor_ProcessServer, lc *leaderConn, rs *replayStream, cause error) error {
	f.routes[routeFallback].Inc()
	f.log.V(3).Info("leader did not answer; scheduling the stream here", "leader", lc.holder, "error", cause.Error())
	rs.ExternalProcessor_ProcessServer = gw
	return f.local.Process(rs)
}

// localRefusal returns the reason of a leader's answer that says only that
// the leader cannot schedule now (a 503 with one of refusals), "" for any
// other answer, which goes to the gateway.
func localRefusal(resp *extprocv3.ProcessingResponse, refusals []string) string {
	ir := resp.GetImmediateResponse()
	if ir == nil || ir.GetStatus().GetCode() != typev3.StatusCode_ServiceUnavailable {
		return ""
	}
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() != extproc.HeaderReason {
			continue
		}
		v := h.GetHeader().GetValue()
		if v == "" {
			v = string(h.GetHeader().GetRawValue())
		}
		if slices.Contains(refusals, v) {
			return v
		}
	}
	return ""
}

// recvResult is one Recv from the gateway.
type recvResult struct {
	m   *extprocv3.ProcessingRequest
	err error
}

// pump copies the gateway's messages to the leader on its own goroutine
// (the two directions must not wait on each other: each side's flow
// control would block the other). Until commit it also keeps them; after
// divert it hands every further message to the local handler instead.
type pump struct {
	gw     extprocv3.ExternalProcessor_ProcessServer
	up     extprocv3.ExternalProcessor_ProcessClient
	broken atomic.Bool // the upstream failed: stop sending to it
	rest   chan recvResult
	held   heldBudget // where the kept bytes are counted; nil: nowhere

	mu       sync.Mutex
	kept     bool // replay holds every message so far
	replay   []*extprocv3.ProcessingRequest
	size     int64 // bytes in replay, taken from held
	end      error // the gateway's last Recv error, once it came
	diverted bool
}

func (p *pump) run(cancel context.CancelFunc) {
	for {
		m, err := p.gw.Recv()
		p.mu.Lock()
		if p.diverted {
			p.mu.Unlock()
			select {
			case p.rest <- recvResult{m, err}:
			case <-p.gw.Context().Done():
				return
			}
			if err != nil {
				return
			}
			continue
		}
		if err != nil {
			p.end = err
		} else if p.kept {
			if n := int64(proto.Size(m)); p.size+n > replayLimit || !p.take(n) {
				p.dropLocked()
			} else {
				p.size += n
				p.replay = append(p.replay, m)
			}
		}
		p.mu.Unlock()
		if err != nil {
			if errors.Is(err, io.EOF) {
				if !p.broken.Load() {
					_ = p.up.CloseSend()
				}
			} else {
				cancel() // the gateway went away: so does the upstream
			}
			return
		}
		if !p.broken.Load() {
			if err := p.up.Send(m); err != nil {
				p.broken.Store(true) // the receive side learns why
			}
		}
	}
}

// commit drops the kept messages: the leader answered, there is no going
// back.
func (p *pump) commit() {
	p.mu.Lock()
	p.dropLocked()
	p.mu.Unlock()
}

// take reserves n bytes of the held-body budget for a kept message.
func (p *pump) take(n int64) bool {
	return p.held == nil || p.held.ReserveHeldBodyBytes(n)
}

// dropLocked stops keeping messages and gives their bytes back to the
// budget. p.mu is held.
func (p *pump) dropLocked() {
	if p.held != nil && p.size > 0 {
		p.held.ReleaseHeldBodyBytes(p.size)
	}
	p.kept, p.replay, p.size = false, nil, 0
}

// divert turns the stream over to the local handler, when every message
// so far was kept: the returned stream replays them, then goes on with the
// gateway's.
func (p *pump) divert() (*replayStream, bool) {
	p.broken.Store(true)
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.kept {
		return nil, false
	}
	p.diverted = true
	rs := &replayStream{msgs: p.replay, end: p.end, rest: p.rest}
	// The local handler counts the replayed body in the budget itself.
	p.dropLocked()
	return rs, true
}

// replayStream is the gateway's stream as the local handler sees it after
// a fallback: the kept messages first, then the rest as they come.
type replayStream struct {
	extprocv3.ExternalProcessor_ProcessServer
	msgs []*extprocv3.ProcessingRequest
	end  error
	rest <-chan recvResult
}

// Recv implements extprocv3.ExternalProcessor_ProcessServer.
func (r *replayStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if len(r.msgs) > 0 {
		m := r.msgs[0]
		r.msgs[0] = nil
		r.msgs = r.msgs[1:]
		return m, nil
	}
	if r.end != nil {
		return nil, r.end
	}
	select {
	case res := <-r.rest:
		if res.err != nil {
			r.end = res.err
		}
		return res.m, res.err
	case <-r.Context().Done():
		r.end = r.Context().Err()
		return nil, r.end
	}
}
