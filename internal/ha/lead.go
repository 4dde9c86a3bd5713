package ha

import (
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/laneway-dev/laneway/internal/dispatcher"
	"github.com/laneway-dev/laneway/pkg/extproc"
	"github.com/laneway-dev/laneway/pkg/replica"
	"github.com/laneway-dev/laneway/pkg/sched"
)

// Scheduler is the replica's dispatcher as the link's server feeds it.
type Scheduler interface {
	Offer(t *sched.Ticket, done func(*sched.Grant, error)) *dispatcher.Offered
	Cancel(o *dispatcher.Offered)
	// HasQueue reports whether requests are queued: followers then send
	// their release events at once.
	HasQueue() bool
}

// TicketServerConfig configures NewTicketServer.
type TicketServerConfig struct {
	// Scheduler is the replica's dispatcher: followers' tickets join its
	// queue as the replica's own requests do.
	Scheduler Scheduler
	// Self is this replica's holder identity, sent in the hello.
	Self string
	// Gate is the replica's readiness gate: while it gives a reason the
	// replica decides no ticket (each is answered "offer it elsewhere").
	Gate func() string
	// Answer is the replica's own answer to a scheduling error (a 429 or
	// 503 *extproc.Reply, as its handler would reply), which a follower
	// passes on to its client unchanged.
	Answer func(error) error
	// Registry gets the link's series.
	Registry prometheus.Registerer
	Log      logr.Logger
}

// Outcomes of laneway_ha_tickets_total.
const (
	ticketGranted   = "granted"   // an endpoint
	ticketReplied   = "replied"   // a 429 or 503 for the client
	ticketRefused   = "refused"   // not decided: not ready, shutting down (the follower offers it elsewhere)
	ticketCancelled = "cancelled" // the follower gave up before the decision
	ticketLost      = "lost"      // granted, and its link ended before its done: given back
)

// TicketServer is the leader's side of the replica link (SPEC §15): each
// follower's stream of tickets is fed into this replica's dispatcher, so
// its one queue orders the whole pool's requests, and the decisions go
// back on the stream. Any replica serves it (a follower that still gets
// tickets from a peer with an older view of the Lease decides them, and
// never sends them on).
//
// A follower's link ending (the follower crashed, a network cut, a
// shutdown) takes back everything it held: its queued tickets leave the
// queue, and its grants are given back as done (lost).
type TicketServer struct {
	sched    Scheduler
	self     string
	gate     func() string
	answer   func(error) error
	log      logr.Logger
	outcomes map[string]prometheus.Counter
	links    prometheus.Gauge
}

// NewTicketServer returns the link's server for cfg.
func NewTicketServer(cfg TicketServerConfig) (*TicketServer, error) {
	outcomes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricTickets,
		Help: "Followers' tickets this replica decided, by outcome: granted, replied (a 429 or 503 for the client), refused (not decided: not ready or shutting down; offered elsewhere), cancelled (the follower gave up first), lost (granted, and the follower's link ended before its done: given back).",
	}, []string{"outcome"})
	children := map[string]prometheus.Counter{}
	for _, o := range []string{ticketGranted, ticketReplied, ticketRefused, ticketCancelled, ticketLost} {
		children[o] = outcomes.WithLabelValues(o)
	}
	links := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: MetricLinks,
		Help: "Followers' replica links open to this replica.",
	})
	if err := errors.Join(cfg.Registry.Register(outcomes), cfg.Registry.Register(links)); err != nil {
		return nil, fmt.Errorf("register the replica link's series: %w", err)
	}
	return &TicketServer{sched: cfg.Scheduler, self: cfg.Self, gate: cfg.Gate, answer: cfg.Answer, log: cfg.Log,
		outcomes: children, links: links}, nil
}

var _ replica.LinkServer = (*TicketServer)(nil)

// Link implements replica.LinkServer: one follower's stream, until it
// ends.
func (s *TicketServer) Link(stream grpc.ServerStream) error {
	var f replica.Frame
	if err := stream.RecvMsg(&f); err != nil {
		return err
	}
	if f.Hello == nil {
		return status.Error(codes.FailedPrecondition, "the link's first frame must be a hello")
	}
	peer := f.Hello.Identity
	if err := stream.SendMsg(&replica.Frame{Hello: &replica.Hello{Version: replica.Version, Identity: s.self}}); err != nil {
		return err
	}
	if f.Hello.Version != replica.Version {
		s.log.Error(nil, "refusing a follower's link: it speaks another replica protocol version; it decides its requests itself while this replica leads",
			"follower", peer, "followerVersion", f.Hello.Version, "version", replica.Version)
		return status.Errorf(codes.FailedPrecondition, "replica protocol version %d refused: this replica speaks %d", f.Hello.Version, replica.Version)
	}
	s.links.Inc()
	defer s.links.Dec()
	l := &followerLink{s: s, peer: peer, offers: map[uint64]*offer{}, wake: make(chan struct{}, 1), done: make(chan struct{})}
	s.log.V(2).Info("follower linked", "follower", peer)
	go l.send(stream)
	err := l.serve(stream)
	l.end()
	s.log.V(2).Info("follower's link ended; what it held is given back", "follower", peer, "error", errString(err))
	return err
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// followerLink is one follower's stream on the leader: the receive loop
// (serve, the stream's own goroutine), which alone offers and cancels,
// and the sender (send); the dispatcher's loop reports decisions
// (decided).
type followerLink struct {
	s    *TicketServer
	peer string
	wake chan struct{} // capacity 1: answers are waiting
	done chan struct{} // closed when the link ended

	mu      sync.Mutex
	offers  map[uint64]*offer // offered and not yet over, by ticket id; nil once the link ended
	answers []answer          // decided, to be sent
}

// offer is one ticket of the link, from its arrival until its done
// (granted), its error, or its cancel.
type offer struct {
	id uint64
	t  *sched.Ticket
	h  *dispatcher.Offered // set and read by the receive loop only
	g  *sched.Grant        // once granted
}

// answer is a decision waiting to be encoded and sent.
type answer struct {
	o      *offer
	err    error
	refuse string // a reason: not decided, offer it elsewhere
}

// serve receives frames until the stream ends.
func (l *followerLink) serve(stream grpc.ServerStream) error {
	var f replica.Frame
	for {
		if err := stream.RecvMsg(&f); err != nil {
			if errors.Is(err, io.EOF) {
				return nil // the follower closed the link
			}
			return err
		}
		for i := range f.Tickets {
			if err := l.ticket(f.Tickets[i]); err != nil {
				return err
			}
		}
		for _, r := range f.Releases {
			l.release(r)
		}
	}
}

// ticket offers one ticket to the dispatcher, unless the replica's gate
// is closed.
func (l *followerLink) ticket(tk replica.Ticket) error {
	o := &offer{id: tk.ID, t: tk.T}
	l.mu.Lock()
	if _, dup := l.offers[o.id]; dup {
		l.mu.Unlock()
		return status.Errorf(codes.InvalidArgument, "ticket %d offered twice on one link", o.id)
	}
	if reason := l.s.gate(); reason != "" {
		replica.PutChain(o.t.Blocks)
		o.t.Blocks = nil
		l.answerLocked(answer{o: o, refuse: reason})
		l.mu.Unlock()
		return nil
	}
	l.offers[o.id] = o
	l.mu.Unlock()
	o.h = l.s.sched.Offer(o.t, func(g *sched.Grant, err error) { l.decided(o, g, err) })
	return nil
}

// decided is the dispatcher's answer for o, on its loop: it must not
// block. A ticket the follower cancelled meanwhile, or of a link that
// ended, has its grant given back instead.
func (l *followerLink) decided(o *offer, g *sched.Grant, err error) {
	// The core is done with the ticket's chain: the request left it.
	replica.PutChain(o.t.Blocks)
	o.t.Blocks = nil
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.offers[o.id] != o { // cancelled, or the link ended
		if g != nil {
			g.Done() // a Done after Cancel's own release is a no-op
		}
		l.s.outcomes[ticketCancelled].Inc()
		return
	}
	switch {
	case g != nil:
		o.g = g
	case errors.Is(err, sched.ErrCancelled):
		delete(l.offers, o.id) // cannot happen: cancelling removes the offer first
		return
	default:
		delete(l.offers, o.id)
	}
	a := answer{o: o, err: err}
	if errors.Is(err, sched.ErrShuttingDown) {
		a.refuse = ReasonShuttingDown
	}
	l.answerLocked(a)
}

// ReasonShuttingDown is the reason a replica that is shutting down gives
// a follower for not deciding its ticket.
const ReasonShuttingDown = "shutting_down"

func (l *followerLink) answerLocked(a answer) {
	l.answers = append(l.answers, a)
	wakeUp(l.wake)
}

// release applies a follower's event to its ticket.
func (l *followerLink) release(r replica.Release) {
	l.mu.Lock()
	o := l.offers[r.ID]
	if o == nil {
		l.mu.Unlock()
		return // over already (an event that crossed the decision, or a duplicate)
	}
	g := o.g
	if r.Event != replica.EventFirstByte || g == nil {
		delete(l.offers, r.ID)
	}
	l.mu.Unlock()
	switch {
	case g != nil && r.Event == replica.EventFirstByte:
		g.FirstByte()
	case g != nil:
		g.Done() // done, or cancelled after the grant crossed the cancel
	default:
		// Cancelled while queued (or a done before any decision, which a
		// follower does not send): the loop answers ErrCancelled, or
		// gives back a grant it made meanwhile (decided).
		l.s.sched.Cancel(o.h)
	}
}

// end takes back everything the link held: queued tickets leave the
// queue, and grants are given back (lost).
func (l *followerLink) end() {
	l.mu.Lock()
	offers := l.offers
	l.offers = nil
	l.mu.Unlock()
	close(l.done)
	for _, o := range offers {
		if o.g != nil {
			lost(o.g)
			l.s.outcomes[ticketLost].Inc()
			continue
		}
		l.s.sched.Cancel(o.h)
	}
}

// lost gives back a grant whose follower can no longer report its events
// (its link ended) as a done. The request may still be running on its
// engine: a grant whose first byte was not reported keeps its prefill
// charge in the endpoint's engine ledger until the engine's counters say
// the prompt left prefill (pkg/sched, SPEC §5), exactly as a header-only
// gateway's grant does; one past its first byte only stops counting as
// decoding.
func lost(g *sched.Grant) { g.Done() }

// send encodes and writes the answers until the link ends.
func (l *followerLink) send(stream grpc.ServerStream) {
	var pending []answer
	var out outbox
	for {
		select {
		case <-l.wake:
		case <-l.done:
			return
		}
		linger()
		l.mu.Lock()
		pending, l.answers = l.answers, pending[:0]
		l.mu.Unlock()
		for i := range pending {
			out.add(l.encode(&pending[i]))
			pending[i] = answer{}
		}
		for _, f := range out.take() {
			if err := stream.SendMsg(replica.Raw(f)); err != nil {
				return // the receive loop sees the stream end too
			}
		}
	}
}

// encode is one answer's frame item.
func (l *followerLink) encode(a *answer) []byte {
	d := replica.Decision{ID: a.o.id, Queued: l.s.sched.HasQueue()}
	switch {
	case a.refuse != "":
		d.Kind, d.Reason = replica.KindRetry, a.refuse
		l.s.outcomes[ticketRefused].Inc()
	case a.err == nil:
		t := a.o.t
		d.Kind, d.Endpoints, d.Engine, d.Prefiller = replica.KindGrant, a.o.g.Endpoints, a.o.g.Engine, a.o.g.Prefiller()
		d.Priority, d.Cached, d.Class = t.EffectivePriority(), t.Cached, t.Class
		l.s.outcomes[ticketGranted].Inc()
	default:
		d.Kind = replica.KindReply
		var r *extproc.Reply
		if !errors.As(l.s.answer(a.err), &r) {
			r = &extproc.Reply{Status: 503, Reason: "internal", Message: "endpoint picker error"}
		}
		d.Status, d.Reason, d.Message, d.Body, d.RetryAfter = r.Status, r.Reason, r.Message, r.Body, r.RetryAfter
		l.s.outcomes[ticketReplied].Inc()
	}
	return replica.AppendDecision(make([]byte, 0, 128), &d)
}
