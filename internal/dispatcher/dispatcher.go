package dispatcher

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/laneway-dev/laneway/pkg/policy"
	"github.com/laneway-dev/laneway/pkg/sched"
)

// Dispatcher drives a sched.Core on one goroutine with the wall clock.
// Create it with New, start Run, then call Acquire from any number of
// request goroutines.
type Dispatcher struct {
	cmds  chan command
	done  chan struct{} // closed when Run returns
	start time.Time
	obs   []Observer
	onEps func([]sched.Endpoint)

	// Response-path events (Grant.FirstByte, Grant.Done) go to a mailbox,
	// not the command channel: the loop applies them before every command,
	// so admissions and snapshots see current accounting, and an event
	// wakes the loop only while requests are queued, the one case where it
	// can let one go. An idle endpoint's stream thus hands off to the loop
	// once (Acquire) instead of three times. See Release and settle.
	relMu    sync.Mutex
	rels     []release
	relWake  chan struct{} // capacity 1: "the mailbox has news"
	hasQueue atomic.Bool   // the loop holds queued requests; set by the loop
	stopped  atomic.Bool   // Run returned: releases are dropped
	senders  atomic.Int64  // callers between their look at done and their send
	hashBS   atomic.Int64  // the core's BlockSize, published by the loop
	identity atomic.Pointer[policy.Identity]

	// Loop-owned.
	core     *sched.Core
	timer    *time.Timer // the next wait-budget expiry
	relSpare []release   // the mailbox's other buffer
}

// command is one request to the loop, sent by value: an Acquire (w), the
// cancel of one (w, cancel), a scrape (scrape, which reports whether it
// changed what the core may let go), or anything else as a function run on
// the loop (fn). Only Acquire and cancel are on the per-request path.
type command struct {
	w      *waiter
	cancel bool
	scrape func() bool
	fn     func()
}

type release struct {
	g  *sched.Grant
	ev sched.Event
}

// waiter is one Acquire call: the core's request and the reply channel the
// loop sends its one answer on; or one Offer, whose answer goes to done
// instead.
type waiter struct {
	req   sched.Request
	reply chan result
	done  func(*sched.Grant, error)
}

type result struct {
	g   *sched.Grant
	err error
}

// waiters recycles waiters and their reply channels. A waiter goes back
// only when the loop no longer holds it (never sent, or answer received).
var waiters = sync.Pool{New: func() any { return &waiter{reply: make(chan result, 1)} }}

// New returns a dispatcher scheduling with pol.
func New(pol *sched.Policy, opts Options) (*Dispatcher, error) {
	d := &Dispatcher{cmds: make(chan command, 1024), done: make(chan struct{}), relWake: make(chan struct{}, 1),
		start: time.Now(), obs: opts.Observers, onEps: opts.OnEndpoints}
	co := opts.Options
	co.Releaser = mailbox{d}
	core, err := sched.New(pol, co)
	if err != nil {
		return nil, err
	}
	d.core = core
	d.hashBS.Store(int64(core.BlockSize()))
	d.identity.Store(pol.Identity)
	d.timer = time.NewTimer(time.Hour)
	d.timer.Stop()
	return d, nil
}

func (d *Dispatcher) now() int64 { return int64(time.Since(d.start)) }

// Run owns the core until ctx ends; then it answers every queued request
// with ErrShuttingDown and returns. Acquire calls after that fail fast.
func (d *Dispatcher) Run(ctx context.Context) {
	for {
		d.settle()
		select {
		case c := <-d.cmds:
			if took := d.takeReleases(); !d.handle(c) && !took {
				// A scrape that changed no endpoint's busy inputs: the
				// last flush's decisions stand (a Drain would re-probe
				// every queued head against every endpoint for nothing).
				continue
			}
		case <-d.relWake:
			d.takeReleases()
		case <-d.timer.C:
			d.takeReleases()
		case <-ctx.Done():
			d.takeReleases()
			d.core.Shutdown(d.now())
			d.flush()
			d.timer.Stop()
			d.stopped.Store(true)
			close(d.done)
			d.answerLate()
			return
		}
		d.flush()
	}
}

// handle runs one command and reports whether the core may have
// decisions to make: false only for a scrape that changed nothing.
func (d *Dispatcher) handle(c command) bool {
	switch {
	case c.scrape != nil:
		return c.scrape()
	case c.fn != nil:
		c.fn()
	case c.cancel:
		d.core.Cancel(&c.w.req)
	default:
		d.core.Admit(d.now(), &c.w.req)
	}
	return true
}

// flush drains the core, answers every request it decided and arms the
// timer for the next wait-budget expiry. Every loop turn ends with one,
// except a scrape's that changed no busy input (handle), so no state
// change that may let a request go is left undrained.
func (d *Dispatcher) flush() {
	leaves := d.core.Drain(d.now())
	for i := range leaves {
		l := &leaves[i]
		for _, o := range d.obs {
			o.Decided(l)
		}
		if w := l.Req.Owner.(*waiter); w.done != nil {
			w.done(l.Grant, l.Err)
		} else {
			w.reply <- result{l.Grant, l.Err} // buffered: the loop's last use of it
		}
	}
	d.publishBlockSize()
	d.timer.Stop()
	if at, ok := d.core.NextDeadline(); ok {
		d.timer.Reset(max(0, time.Duration(at-d.now())))
	}
}

// publishBlockSize makes the core's hashing block size the one BlockSize
// reports, writing the shared word only when it changed (every request
// goroutine reads it).
func (d *Dispatcher) publishBlockSize() {
	if bs := int64(d.core.BlockSize()); d.hashBS.Load() != bs {
		d.hashBS.Store(bs)
	}
}

// HasQueue reports whether the loop held queued requests when it last
// looked (every turn): release events are then wanted at once, since one
// may let a request go. Safe for concurrent use.
func (d *Dispatcher) HasQueue() bool { return d.hasQueue.Load() }

// mailbox is the core's Releaser: the dispatcher's mailbox.
type mailbox struct{ d *Dispatcher }

// Release puts a response-path event in the mailbox and wakes the loop if
// it holds queued requests, which the event may let go. It never blocks on
// the loop.
//
// No wake-up is lost: the loop publishes hasQueue before it looks at the
// mailbox a last time (settle), and Release appends before it reads
// hasQueue, so either the loop's look finds the event or Release sees
// hasQueue set. Whatever the loop takes from the mailbox, on any path, is
// followed by a flush in the same turn.
func (m mailbox) Release(g *sched.Grant, ev sched.Event) {
	d := m.d
	if d.stopped.Load() {
		return
	}
	d.relMu.Lock()
	d.rels = append(d.rels, release{g, ev})
	d.relMu.Unlock()
	if d.hasQueue.Load() {
		select {
		case d.relWake <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
}

// takeReleases applies the mailbox's events in the order they were posted
// and reports whether there were any.
func (d *Dispatcher) takeReleases() bool {
	d.relMu.Lock()
	rs := d.rels
	d.rels = d.relSpare[:0]
	d.relMu.Unlock()
	for i, r := range rs {
		d.core.Release(r.g, r.ev)
		rs[i] = release{} // the grant may be collected
	}
	d.relSpare = rs
	return len(rs) > 0
}

// settle begins a loop turn: it publishes whether requests are queued and,
// if so, applies and drains for the events posted meanwhile, until none is
// left to look at.
func (d *Dispatcher) settle() {
	for {
		queued := d.core.Len() > 0
		d.hasQueue.Store(queued)
		if !queued || !d.takeReleases() {
			return
		}
		d.flush()
	}
}

// answerLate answers, once the loop stopped (done is closed), the
// commands of callers that looked at done before it closed: an admission
// gets ErrShuttingDown, a function still runs. A caller that looks at
// done after it closed sends nothing (enter), so once no caller is
// between the two and the channel is empty, nothing can arrive any more.
func (d *Dispatcher) answerLate() {
	for {
		select {
		case c := <-d.cmds:
			d.handle(c)
			d.flush()
		default:
			if d.senders.Load() == 0 && len(d.cmds) == 0 {
				return
			}
			runtime.Gosched() // a caller is about to send or to give up
		}
	}
}

// enter begins a send: it reports false, and the caller must not send,
// once the loop has stopped. A true answer must be followed by leave.
func (d *Dispatcher) enter() bool {
	d.senders.Add(1)
	select {
	case <-d.done:
		d.senders.Add(-1)
		return false
	default:
		return true
	}
}

func (d *Dispatcher) leave() { d.senders.Add(-1) }

// send hands a command to the loop, or reports false once it has stopped.
// A command sent is handled, before or after the loop stopped.
func (d *Dispatcher) send(c command) bool {
	if !d.enter() {
		return false
	}
	defer d.leave()
	select {
	case d.cmds <- c:
		return true
	case <-d.done:
		return false
	}
}

// Acquire offers a ticket and waits until it is granted an endpoint or
// answered with an error: *drr.Rejection (429), *ShedError (429),
// *NoEndpointError (503), ErrShuttingDown (503), or ctx's error when the
// caller gave up (the ticket then leaves the queue at once).
func (d *Dispatcher) Acquire(ctx context.Context, t *sched.Ticket) (*sched.Grant, error) {
	if !d.enter() {
		return nil, sched.ErrShuttingDown
	}
	w := waiters.Get().(*waiter)
	w.req.Reset(t, w)
	select {
	case d.cmds <- command{w: w}:
		d.leave()
	case <-d.done:
		d.leave()
		waiters.Put(w)
		return nil, sched.ErrShuttingDown
	case <-ctx.Done():
		d.leave()
		waiters.Put(w)
		return nil, ctx.Err()
	}
	select {
	case r := <-w.reply:
		waiters.Put(w) // the answer was the loop's last use of w
		return r.g, r.err
	case <-ctx.Done():
		// The loop may have answered meanwhile; Cancel then releases that
		// grant instead of removing a queued request. w is not recycled:
		// the loop may still send on it.
		d.send(command{w: w, cancel: true})
		return nil, ctx.Err()
	case <-d.done:
		// Run answered what it decided before closing done; a command
		// that raced in gets ErrShuttingDown after, into the buffered
		// reply nobody reads (w is not recycled).
		select {
		case r := <-w.reply:
			return r.g, r.err
		default:
			return nil, sched.ErrShuttingDown
		}
	}
}

// Offered is a ticket handed to the loop by Offer, which no caller waits
// for.
type Offered struct{ w *waiter }

// Offer hands t to the loop without waiting for the answer: done is
// called exactly once with what Acquire would have returned (a grant, or
// *drr.Rejection, *ShedError, *NoEndpointError, ErrShuttingDown, or
// ErrCancelled after Cancel). It runs on the loop goroutine, so it must
// not block or call the dispatcher; when the loop has stopped it runs on
// the caller's goroutine before Offer returns. The leader's side of the
// replica link (internal/ha) offers its followers' tickets this way, with
// no goroutine per ticket. Offer blocks only while the command channel is
// full. The loop may read t until done was called.
func (d *Dispatcher) Offer(t *sched.Ticket, done func(*sched.Grant, error)) *Offered {
	w := &waiter{done: done}
	w.req.Reset(t, w)
	if !d.send(command{w: w}) {
		done(nil, sched.ErrShuttingDown)
	}
	return &Offered{w}
}

// Cancel withdraws an offered ticket: still queued, it leaves the queue
// and its done gets ErrCancelled; already granted, the grant is released
// (as Acquire's cancellation does); already answered otherwise, nothing
// happens. It blocks only while the command channel is full.
func (d *Dispatcher) Cancel(o *Offered) { d.send(command{w: o.w, cancel: true}) }
