package extproc

import (
	"sync"
	"sync/atomic"
	"time"
)

// DefaultMaxHeldBodyBytes is Options.MaxHeldBodyBytes' default (512 MiB).
const DefaultMaxHeldBodyBytes = 512 << 20

// bodySlice bounds the buffer a stream allocates, and so reserves, ahead
// of the bytes that arrived: the first buffer of a body announced larger
// is at most this big, and it grows by doubling as bytes come, up to the
// announced length. A client that announces 16 MiB and sends one byte
// holds 64 KiB of the budget, not 16 MiB; one that sends its body holds
// at most twice what it sent.
const bodySlice = 64 << 10

// budget counts the request bytes held by the streams, against a limit:
// the header block of every open stream, and the body buffers of those
// that have not passed their body back to the gateway yet. It is safe for
// concurrent use: every stream of a Server shares it.
type budget struct {
	limit int64
	held  atomic.Int64 // headers and bodies
	hdr   atomic.Int64 // the headers' part of held
}

// reserve takes n bytes unless that would pass the limit. It returns the
// bytes held before and whether n was taken.
func (b *budget) reserve(n int64) (held int64, ok bool) {
	for {
		cur := b.held.Load()
		if cur+n > b.limit {
			return cur, false
		}
		if b.held.CompareAndSwap(cur, cur+n) {
			return cur, true
		}
	}
}

// reserveUpTo takes hi bytes, or as many as the limit leaves room for
// but at least lo (lo <= hi). It returns what it took, the bytes held
// before, and whether it took anything.
func (b *budget) reserveUpTo(lo, hi int64) (took, held int64, ok bool) {
	for {
		cur := b.held.Load()
		n := min(hi, b.limit-cur)
		if n < lo {
			return 0, cur, false
		}
		if b.held.CompareAndSwap(cur, cur+n) {
			return n, cur, true
		}
	}
}

// force takes n bytes whatever the limit: bytes a stream already admitted
// must hold (a body replacement) are never refused, and push later
// requests out instead.
func (b *budget) force(n int64) { b.held.Add(n) }

// release gives back n reserved bytes.
func (b *budget) release(n int64) { b.held.Add(-n) }

// reserveHeaders takes n bytes for a header block (reserve, counted as
// headers too).
func (b *budget) reserveHeaders(n int64) (held int64, ok bool) {
	held, ok = b.reserve(n)
	if ok {
		b.hdr.Add(n)
	}
	return held, ok
}

// releaseHeaders gives back n bytes of reserveHeaders.
func (b *budget) releaseHeaders(n int64) {
	b.hdr.Add(-n)
	b.held.Add(-n)
}

// DefaultBodyTimeout is Options.BodyTimeout's default: a 16 MiB body
// arrives in it at 280 kB/s, far slower than a gateway on the pod network
// forwards a client's upload, while a client that stalls holds a stream
// (and whatever of its body arrived) for at most this long.
const DefaultBodyTimeout = time.Minute

// bodyClock times the arrival of one stream's request body
// (Options.BodyTimeout). Its timer's callback runs on a goroutine of its
// own and answers the stream 408 while the stream's goroutine waits in
// Recv for the body, so the two share mu: the stream's goroutine holds it
// while it handles a message of the body phase, and the body phase ends
// under it, with the body's last byte or with the deadline, whichever
// comes first; the loser finds st nil and does nothing.
//
// Clocks are recycled with their timer (Reset re-arms the same callback),
// so timing a body costs no allocation; a clock whose timer could not be
// stopped before it fired is left to the collector, as its callback may
// still be about to run.
type bodyClock struct {
	mu    sync.Mutex
	timer *time.Timer
	st    *stream // the stream timed; nil once its body phase ended
	fired bool    // the deadline ended the body phase and answered st
}

var clocks sync.Pool // of *bodyClock, stopped

// startBodyClock starts timing st's body: it is answered 408 if its body
// phase has not ended within d.
func startBodyClock(st *stream, d time.Duration) *bodyClock {
	c, _ := clocks.Get().(*bodyClock)
	if c == nil {
		c = &bodyClock{}
		c.mu.Lock()
		c.st = st
		c.timer = time.AfterFunc(d, c.expire)
		c.mu.Unlock()
		return c
	}
	c.mu.Lock()
	c.st, c.fired = st, false
	c.timer.Reset(d)
	c.mu.Unlock()
	return c
}

// expire is the timer's callback: the deadline passed.
func (c *bodyClock) expire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.st
	if st == nil {
		return // the body phase ended first
	}
	c.st, c.fired = nil, true
	st.bodyTimedOut()
}

// lockBody is called by the stream's goroutine before it handles a
// message of the body phase (or ends that phase). It reports false when
// the deadline has answered the stream already: the stream then has
// nothing left to do. Every true must be followed by unlockBody.
func (st *stream) lockBody() bool {
	c := st.clock
	if c == nil {
		return true
	}
	c.mu.Lock()
	if c.fired {
		c.mu.Unlock()
		return false
	}
	return true
}

// unlockBody ends lockBody's hold; done says the body phase is over (the
// body is complete, or the stream was answered), which stops the clock
// and recycles it when its timer stopped in time.
func (st *stream) unlockBody(done bool) {
	c := st.clock
	if c == nil {
		return
	}
	if !done {
		c.mu.Unlock()
		return
	}
	st.clock, c.st = nil, nil
	stopped := c.timer.Stop()
	c.mu.Unlock()
	if stopped {
		clocks.Put(c)
	}
}

// stopBodyClock ends the body phase whatever state it is in; it reports
// whether the deadline had answered the stream. After it, the stream's
// goroutine sees everything the deadline's callback did.
func (st *stream) stopBodyClock() (fired bool) {
	if !st.lockBody() {
		return true
	}
	st.unlockBody(true)
	return false
}
