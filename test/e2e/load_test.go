package e2e

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// load is an open-loop load generator: one request every interval, each
// on its own goroutine, until stop or max requests. Open loop keeps
// arrivals independent of answers, so a slow or failing picker cannot
// slow the load down and hide a lost request.
type load struct {
	r        *release
	interval time.Duration
	max      int
	next     func(i int) request

	// phase is stamped on each request when it is sent; scenarios bump it
	// at each step (deletion begun, picker restarted, ...).
	phase atomic.Int32

	mu      sync.Mutex
	answers []phasedAnswer
	waiters []loadWaiter

	stopOnce sync.Once
	stopCh   chan struct{}
	wg       sync.WaitGroup
	issued   sync.WaitGroup
}

// phasedAnswer is an answer with the phase its request was sent in.
type phasedAnswer struct {
	answer
	phase int
	index int
}

type loadWaiter struct {
	n  int
	ch chan struct{}
}

// startLoad starts sending; every request is bounded by perRequest.
func startLoad(ctx context.Context, r *release, interval time.Duration, max int, perRequest time.Duration, next func(i int) request) *load {
	l := &load{r: r, interval: interval, max: max, next: next, stopCh: make(chan struct{})}
	l.issued.Add(1)
	go func() {
		defer l.issued.Done()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for i := 0; i < max; i++ {
			q, phase := next(i), int(l.phase.Load())
			l.wg.Add(1)
			go func(i int) {
				defer l.wg.Done()
				rctx, cancel := context.WithTimeout(ctx, perRequest)
				defer cancel()
				a := r.send(rctx, q)
				l.record(phasedAnswer{answer: a, phase: phase, index: i})
			}(i)
			select {
			case <-tick.C:
			case <-l.stopCh:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return l
}

func (l *load) record(a phasedAnswer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.answers = append(l.answers, a)
	n := len(l.answers)
	kept := l.waiters[:0]
	for _, w := range l.waiters {
		if n >= w.n {
			close(w.ch)
		} else {
			kept = append(kept, w)
		}
	}
	l.waiters = kept
}

// completed returns how many requests have been answered.
func (l *load) completed() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.answers)
}

// waitCompleted waits until n requests have been answered in total.
func (l *load) waitCompleted(ctx context.Context, n int) error {
	l.mu.Lock()
	if len(l.answers) >= n {
		l.mu.Unlock()
		return nil
	}
	w := loadWaiter{n: n, ch: make(chan struct{})}
	l.waiters = append(l.waiters, w)
	l.mu.Unlock()
	select {
	case <-w.ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stop stops sending, waits for every request sent to be answered, and
// returns the answers in completion order.
func (l *load) stop() []phasedAnswer {
	l.stopOnce.Do(func() { close(l.stopCh) })
	l.issued.Wait()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]phasedAnswer(nil), l.answers...)
}
