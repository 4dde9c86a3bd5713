package ha

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/laneway-dev/laneway/pkg/extproc"
	"github.com/laneway-dev/laneway/pkg/policy"
	"github.com/laneway-dev/laneway/pkg/replica"
	"github.com/laneway-dev/laneway/pkg/sched"
)

// Acquirer is a scheduler as the request path uses it: the replica's own
// dispatcher, or Tickets in front of it.
type Acquirer interface {
	Acquire(ctx context.Context, t *sched.Ticket) (*sched.Grant, error)
}

// LeaderView is what a follower needs from the elector (Elector).
type LeaderView interface {
	// IsLeader reports whether this replica leads.
	IsLeader() bool
	// Leader returns the holder identity of a leader to send tickets to,
	// "" when there is none (this replica leads, or no fresh holder is
	// known).
	Leader() string
}

// The HA series, registered only with leader election.
const (
	MetricLeader  = "laneway_ha_leader"
	MetricStreams = "laneway_ha_streams_total"
	MetricTickets = "laneway_ha_tickets_total"
	MetricLinks   = "laneway_ha_follower_links"
	MetricReoffer = "laneway_ha_reoffered_wait_seconds"
)

// Routes of laneway_ha_streams_total: where each request offered for a
// decision was decided.
const (
	routeLeader    = "leader"    // here, this replica holds the Lease
	routeForwarded = "forwarded" // by the leader, its ticket sent over the link
	routeLocal     = "local"     // here: no reachable leader (none, stale, not connected), or forwarded to us by a peer
	routeFallback  = "fallback"  // here, after the leader failed or refused the ticket before deciding
	routeReoffered = "reoffered" // by the next leader, after the previous one failed or refused the ticket
)

// TicketsConfig configures NewTickets.
type TicketsConfig struct {
	// Leader says who leads (the Elector).
	Leader LeaderView
	// Self is this replica's holder identity, sent in the link's hello.
	Self string
	// Local is the replica's own dispatcher: it decides while this
	// replica leads, while no leader is reachable, and the tickets a
	// leader failed or refused.
	Local Acquirer
	// TLS is the replica identity the link is dialled with.
	TLS *PeerTLS
	// Registry gets laneway_ha_streams_total.
	Registry prometheus.Registerer
	Log      logr.Logger
}

// Tickets is a follower's scheduler (SPEC §15): the replica parses each
// request itself, and Acquire sends the resulting ticket to the leader
// over the replica link and waits for the leader's decision, so that the
// leader's one queue orders all of the pool's requests; while this
// replica leads, or no leader is reachable, its own dispatcher decides.
//
// Exactly once: Acquire returns once, with a grant (the leader's or the
// local dispatcher's), the leader's 429/503 reply, or ctx's error. A
// ticket whose leader fails (the link breaks) or refuses it (not ready,
// shutting down) before deciding is offered again with its original
// arrival: to the next leader once its link is up, else here. A leader
// decision that crossed a failure on the wire is never used twice: the
// ticket left the failed link's table before it was offered again.
type Tickets struct {
	view   LeaderView
	self   string
	local  Acquirer
	dial   func(holder string) (*grpc.ClientConn, error)
	log    logr.Logger
	routes map[string]prometheus.Counter
	// reoffered observes, for each ticket offered again after its leader
	// failed or refused it, the time from its first offer to its decision.
	reoffered prometheus.Observer
	// retryAfter is how long a link that failed is not dialled again.
	retryAfter time.Duration

	mu    sync.Mutex
	links map[string]*link // by holder; at most one live link each
}

// NewTickets returns a follower's scheduler for cfg.
func NewTickets(cfg TicketsConfig) (*Tickets, error) {
	routes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricStreams,
		Help: "Requests offered for a decision, by where they were decided: leader (here, holding the Lease), forwarded (by the leader, as a ticket), local (here: no reachable leader, or forwarded to us by a peer), fallback (here, after the leader failed or refused the ticket), reoffered (by the next leader, after the previous one failed or refused it).",
	}, []string{"route"})
	children := map[string]prometheus.Counter{}
	for _, r := range []string{routeLeader, routeForwarded, routeLocal, routeFallback, routeReoffered} {
		children[r] = routes.WithLabelValues(r)
	}
	reoffered := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    MetricReoffer,
		Help:    "Tickets offered again after their leader failed or refused them before deciding: the time from the first offer to the decision (here or by the next leader).",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 9), // 1 ms to 65 s
	})
	if err := errors.Join(cfg.Registry.Register(routes), cfg.Registry.Register(reoffered)); err != nil {
		return nil, fmt.Errorf("register the tickets' series: %w", err)
	}
	return &Tickets{view: cfg.Leader, self: cfg.Self, local: cfg.Local, dial: cfg.TLS.dialer(), log: cfg.Log,
		routes: children, reoffered: reoffered, retryAfter: time.Second, links: map[string]*link{}}, nil
}

// localOnlyKey marks a request context whose request must be decided
// here (WithLocalOnly).
type localOnlyKey struct{}

// WithLocalOnly marks ctx: Tickets decides its request here, never over
// the link (a stream a peer replica forwarded to this one: Router).
func WithLocalOnly(ctx context.Context) context.Context {
	return context.WithValue(ctx, localOnlyKey{}, true)
}

func localOnly(ctx context.Context) bool { return ctx.Value(localOnlyKey{}) != nil }

// Acquire implements Acquirer (see the type).
func (c *Tickets) Acquire(ctx context.Context, t *sched.Ticket) (*sched.Grant, error) {
	start := time.Now()
	failed := "" // the holder that failed or refused this ticket
	for {
		if c.view.IsLeader() {
			return c.decideHere(ctx, t, start, routeLeader)
		}
		holder := c.view.Leader()
		var l *link
		if holder != "" && holder != failed && !localOnly(ctx) {
			l = c.linkTo(holder)
		}
		if l == nil {
			if failed == "" {
				return c.decideHere(ctx, t, start, routeLocal)
			}
			g, err := c.decideHere(ctx, t, start, routeFallback)
			c.reoffered.Observe(time.Since(start).Seconds())
			return g, err
		}
		g, err, again := l.acquire(ctx, t, start)
		if !again {
			if err == nil || !isContextErr(err) {
				if failed != "" {
					c.routes[routeReoffered].Inc()
					c.reoffered.Observe(time.Since(start).Seconds())
				} else {
					c.routes[routeForwarded].Inc()
				}
			}
			return g, err
		}
		failed = holder
	}
}

func (c *Tickets) decideHere(ctx context.Context, t *sched.Ticket, start time.Time, route string) (*sched.Grant, error) {
	c.routes[route].Inc()
	t.Waited = time.Since(start)
	return c.local.Acquire(ctx, t)
}

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// linkTo returns the ready link to holder, or nil while there is none:
// it starts one (unless one to holder failed within retryAfter), and the
// ticket is decided here rather than made to wait for a dial that may
// not succeed. Links to other holders stay open while grants they carry
// are running (their releases still go there), and close after.
func (c *Tickets) linkTo(holder string) *link {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.links[holder]
	if l != nil && l.failed() {
		if time.Since(l.failedAt()) < c.retryAfter {
			return nil
		}
		l = nil
	}
	if l == nil {
		l = newLink(c, holder)
		c.links[holder] = l
		go l.run()
	}
	for h, o := range c.links {
		switch {
		case h == holder:
		case o.failed():
			delete(c.links, h)
		default:
			o.retire(true)
		}
	}
	l.retire(false) // it leads (again)
	if !l.isReady() {
		return nil
	}
	return l
}

// forget drops l from the table once it is over.
func (c *Tickets) forget(l *link) {
	c.mu.Lock()
	if c.links[l.holder] == l {
		delete(c.links, l.holder)
	}
	c.mu.Unlock()
}

// Close closes every link; call it once no request is decided any more.
func (c *Tickets) Close() {
	c.mu.Lock()
	links := make([]*link, 0, len(c.links))
	for _, l := range c.links {
		links = append(links, l)
	}
	c.mu.Unlock()
	for _, l := range links {
		l.close(errors.New("closed"))
	}
}

// link is a follower's link to one leader: one gRPC stream carrying its
// tickets and releases up and the leader's decisions down. It runs two
// goroutines besides gRPC's: the receiver (run) and the sender.
type link struct {
	c      *Tickets
	holder string
	ctx    context.Context
	cancel context.CancelFunc
	ready  chan struct{} // closed once the hellos were exchanged
	broken chan struct{} // closed when the link failed or was closed
	wake   chan struct{} // capacity 1: the outbox has news

	mu      sync.Mutex
	err     error // why it broke
	brokeAt time.Time
	retired bool // the holder no longer leads: close once idle
	conn    *grpc.ClientConn
	pending map[uint64]*pending // sent, not decided
	granted map[uint64]struct{} // granted, not done
	out     outbox              // frame items waiting to be sent
	// lazy is armed while release events wait in the outbox for the
	// next frame (see releaseLocked).
	lazy *time.Timer

	nextID atomic.Uint64
	// queued is the leader's last word on its queue (Decision.Queued).
	queued atomic.Bool
}

// pending is a ticket waiting for its decision.
type pending struct {
	reply chan replica.Decision // capacity 1: the receiver never blocks
}

func newLink(c *Tickets, holder string) *link {
	ctx, cancel := context.WithCancel(context.Background())
	return &link{c: c, holder: holder, ctx: ctx, cancel: cancel, ready: make(chan struct{}), broken: make(chan struct{}),
		wake: make(chan struct{}, 1), pending: map[uint64]*pending{}, granted: map[uint64]struct{}{}}
}

func (l *link) isReady() bool {
	select {
	case <-l.ready:
		return true
	default:
		return false
	}
}

func (l *link) failed() bool {
	select {
	case <-l.broken:
		return true
	default:
		return false
	}
}

func (l *link) failedAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.brokeAt
}

// run connects, says hello, and receives decisions until the link
// breaks.
func (l *link) run() {
	log := l.c.log.WithValues("leader", l.holder)
	conn, err := l.c.dial(l.holder)
	if err != nil {
		log.Error(err, "cannot reach the leader; deciding here")
		l.close(err)
		return
	}
	l.mu.Lock()
	closed := l.err != nil
	l.conn = conn
	l.mu.Unlock()
	if closed {
		_ = conn.Close()
		return
	}
	// A leader that accepts the connection but never says hello is as
	// good as none.
	timer := time.AfterFunc(helloTimeout, func() {
		if !l.isReady() {
			l.close(errors.New("no hello from the leader within " + helloTimeout.String()))
		}
	})
	defer timer.Stop()
	stream, err := replica.OpenLink(l.ctx, conn, grpc.WaitForReady(false))
	if err == nil {
		err = l.hello(stream)
	}
	if err != nil {
		switch status.Code(err) {
		case codes.Unimplemented:
			log.Error(err, "the leader does not serve the replica link (a replica of an older version?); deciding here while it leads")
		case codes.FailedPrecondition:
			log.Error(err, "the leader refused the link; deciding here while it leads")
		default:
			log.V(2).Info("cannot open the link to the leader; deciding here", "error", err.Error())
		}
		l.close(err)
		return
	}
	close(l.ready)
	log.Info("sending tickets to the leader")
	go l.send(stream)
	var f replica.Frame
	for {
		if err := stream.RecvMsg(&f); err != nil {
			if l.ctx.Err() == nil {
				log.Info("link to the leader broken; its waiting tickets are offered again", "error", err.Error())
			}
			l.close(err)
			return
		}
		for i := range f.Decisions {
			l.deliver(f.Decisions[i])
		}
	}
}

// hello exchanges the hellos: a leader of another protocol version, or
// one that is not answering as a leader, is refused.
func (l *link) hello(stream grpc.ClientStream) error {
	if err := stream.SendMsg(&replica.Frame{Hello: &replica.Hello{Version: replica.Version, Identity: l.c.self}}); err != nil {
		return err
	}
	var f replica.Frame
	if err := stream.RecvMsg(&f); err != nil {
		return err
	}
	if f.Hello == nil {
		return status.Error(codes.FailedPrecondition, "the leader's first frame is no hello")
	}
	if f.Hello.Version != replica.Version {
		return status.Errorf(codes.FailedPrecondition, "the leader speaks replica protocol version %d, this replica %d: not sending it tickets", f.Hello.Version, replica.Version)
	}
	return nil
}

// send writes the outbox as frames until the link breaks.
func (l *link) send(stream grpc.ClientStream) {
	for {
		select {
		case <-l.wake:
		case <-l.broken:
			return
		}
		linger()
		l.mu.Lock()
		frames := l.out.take()
		l.mu.Unlock()
		for _, f := range frames {
			if err := stream.SendMsg(replica.Raw(f)); err != nil {
				l.close(err) // the receiver learns why, too
				return
			}
		}
	}
}

// enqueueLocked appends frame items to the outbox (l.mu held) and wakes
// the sender.
func (l *link) enqueueLocked(items []byte) {
	l.out.add(items)
	wakeUp(l.wake)
}

// wakeUp signals a sender's capacity-1 channel without blocking.
func wakeUp(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// linger lets the goroutines that are ready to run go first, once, before
// a sender takes its outbox: what they add meanwhile goes in the same
// frame. Under load that packs many tickets (or decisions) into one
// message and one write at the cost of a scheduler turn; idle, it costs
// nothing.
func linger() { runtime.Gosched() }

// frameTarget is the size at which a sender starts a new frame: batches
// stay well below the link's message limit (maxFrameBytes).
const frameTarget = 1 << 20

// helloTimeout bounds the hello exchange of a new link.
const helloTimeout = 10 * time.Second

// outbox collects encoded frame items into frames of about frameTarget
// bytes. gRPC may hold a sent frame's buffer until it is written, so a
// frame's buffer is never reused.
type outbox struct{ frames [][]byte }

func (o *outbox) add(items []byte) {
	if n := len(o.frames); n > 0 && len(o.frames[n-1])+len(items) <= frameTarget {
		o.frames[n-1] = append(o.frames[n-1], items...)
		return
	}
	o.frames = append(o.frames, append(make([]byte, 0, max(len(items), 4096)), items...))
}

// take returns the frames and empties the outbox.
func (o *outbox) take() [][]byte {
	f := o.frames
	o.frames = nil
	return f
}

// acquire sends t and waits for its decision. again says the ticket was
// not decided (the link broke, or the leader refused it): offer it
// elsewhere.
func (l *link) acquire(ctx context.Context, t *sched.Ticket, start time.Time) (g *sched.Grant, err error, again bool) {
	p := &pending{reply: make(chan replica.Decision, 1)}
	t.Waited = time.Since(start)
	id := l.nextID.Add(1)
	// Encoded now, on the request's goroutine and outside the lock: the
	// link does not read the ticket after this.
	item := replica.AppendTicket(make([]byte, 0, 256), id, t)
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		return nil, nil, true
	}
	l.pending[id] = p
	l.enqueueLocked(item)
	l.mu.Unlock()

	select {
	case d := <-p.reply:
		return l.decided(id, t, d)
	case <-ctx.Done():
		l.abandon(id, p)
		return nil, ctx.Err(), false
	case <-l.broken:
		select {
		case d := <-p.reply: // decided just before the link broke
			return l.decided(id, t, d)
		default:
		}
		l.mu.Lock()
		delete(l.pending, id)
		l.mu.Unlock()
		return nil, nil, true
	}
}

// deliver hands a decision to its waiting ticket; one for a ticket no
// longer waiting (its caller gave up) is dropped: the cancel sent for it
// also gives back a grant that crossed it.
func (l *link) deliver(d replica.Decision) {
	l.queued.Store(d.Queued)
	l.mu.Lock()
	p := l.pending[d.ID]
	delete(l.pending, d.ID)
	if p != nil && d.Kind == replica.KindGrant {
		l.granted[d.ID] = struct{}{}
	}
	l.mu.Unlock()
	if p != nil {
		p.reply <- d
	}
}

// decided turns the leader's decision into Acquire's result.
func (l *link) decided(id uint64, t *sched.Ticket, d replica.Decision) (*sched.Grant, error, bool) {
	switch d.Kind {
	case replica.KindGrant:
		if len(d.Endpoints) == 0 {
			l.releaseEvent(id, replica.EventDone)
			return nil, nil, true
		}
		// What the routed hook reads of the ticket, as the leader's core
		// set it: the cost snapshot, and the priority as its tenant may
		// have it (the rights stay the leader's).
		t.Cached, t.Class, t.Priority, t.Rights = d.Cached, d.Class, d.Priority, policy.TenantRights{}
		return sched.RemoteGrant(d.Endpoints, d.Prefiller, d.Engine, remoteRelease{l, id}), nil, false
	case replica.KindReply:
		return nil, &extproc.Reply{Status: d.Status, Reason: d.Reason, Message: d.Message, Body: d.Body, RetryAfter: d.RetryAfter}, false
	}
	l.c.log.V(3).Info("the leader did not schedule a ticket; offering it again", "leader", l.holder, "reason", d.Reason)
	return nil, nil, true
}

// abandon is the caller giving up on ticket id: the leader is told, and
// a grant already delivered is given back.
func (l *link) abandon(id uint64, p *pending) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.pending[id]; ok {
		delete(l.pending, id)
		if l.err == nil {
			l.enqueueLocked(replica.AppendRelease(nil, id, replica.EventCancel))
		}
		return
	}
	select {
	case d := <-p.reply:
		if d.Kind == replica.KindGrant {
			l.releaseLocked(id, replica.EventDone)
		}
	default:
	}
}

// remoteRelease carries a remote grant's events to the leader.
type remoteRelease struct {
	l  *link
	id uint64
}

// Release implements sched.Releaser.
func (r remoteRelease) Release(_ *sched.Grant, ev sched.Event) {
	e := replica.EventFirstByte
	if ev == sched.EventDone {
		e = replica.EventDone
	}
	r.l.releaseEvent(r.id, e)
}

func (l *link) releaseEvent(id uint64, ev replica.Event) {
	l.mu.Lock()
	l.releaseLocked(id, ev)
	l.mu.Unlock()
}

// releaseLocked sends a grant's event (l.mu held). A grant of a broken
// link is forgotten: the leader gave it back when the link broke.
func (l *link) releaseLocked(id uint64, ev replica.Event) {
	if _, ok := l.granted[id]; !ok {
		return
	}
	if ev == replica.EventDone {
		delete(l.granted, id)
	}
	if l.err == nil {
		item := replica.AppendRelease(nil, id, ev)
		if l.queued.Load() || l.retired {
			l.enqueueLocked(item)
		} else {
			l.enqueueLazyLocked(item)
		}
	}
	l.closeIfIdleLocked()
}

// releaseLinger is how long a release event may wait for the next frame
// while the leader holds no queued request: then no request waits for it,
// and the leader's accounting only runs that much behind, while at a few
// hundred tickets a second the events ride in the tickets' frames
// instead of costing the leader a message each.
const releaseLinger = 5 * time.Millisecond

// enqueueLazyLocked adds items without waking the sender: the next frame
// takes them, at the latest after releaseLinger (l.mu held).
func (l *link) enqueueLazyLocked(items []byte) {
	l.out.add(items)
	if l.lazy == nil {
		l.lazy = time.AfterFunc(releaseLinger, func() {
			l.mu.Lock()
			l.lazy = nil
			l.mu.Unlock()
			wakeUp(l.wake)
		})
	}
}

// retire marks a link whose holder no longer leads (or, with false, leads
// again): a retired link closes once its running grants are done.
func (l *link) retire(retired bool) {
	l.mu.Lock()
	if l.retired != retired {
		l.retired = retired
		l.closeIfIdleLocked()
	}
	l.mu.Unlock()
}

func (l *link) closeIfIdleLocked() {
	if l.retired && len(l.granted) == 0 && len(l.pending) == 0 && l.err == nil {
		l.breakLocked(errors.New("the holder no longer leads"))
		go l.c.forget(l)
	}
}

// close breaks the link (once) with err.
func (l *link) close(err error) {
	l.mu.Lock()
	l.breakLocked(err)
	l.mu.Unlock()
}

func (l *link) breakLocked(err error) {
	if l.err != nil {
		return
	}
	if err == nil || errors.Is(err, io.EOF) {
		err = errors.New("the leader ended the link")
	}
	l.err, l.brokeAt = err, time.Now()
	l.granted = map[uint64]struct{}{} // the leader gives them back itself
	close(l.broken)
	l.cancel()
	if l.conn != nil {
		_ = l.conn.Close()
	}
}

// StaticLeader is a LeaderView of a fixed leader whose replica link is at
// addr (standalone --replica-leader): this replica never leads and always
// has that leader to send its tickets to.
func StaticLeader(addr string) LeaderView { return staticLeader(holderIdentity("static", addr, "0")) }

type staticLeader string

func (staticLeader) IsLeader() bool   { return false }
func (s staticLeader) Leader() string { return string(s) }
