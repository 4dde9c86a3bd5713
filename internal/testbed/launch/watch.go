package launch

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// MaxWatch samples one series of a page on a fixed period while a run
// goes on and keeps the largest value seen: for a figure that must stay
// under a bound during a run (an engine's waiting queue) and that no
// single scrape afterwards can show. A sample is a scrape, so a peak
// shorter than the period can be missed; the figure is a lower bound of
// the true maximum. The cost is one scrape per period on a goroutine of
// its own.
type MaxWatch struct {
	stop chan struct{}
	done chan struct{}

	mu      sync.Mutex
	max     float64
	samples int
	err     error
}

// WatchMax starts sampling the sum of the series name with labels (as
// Metrics.Sum reads it; absent reads 0) every period until Stop.
func (p Page) WatchMax(period time.Duration, name string, labels ...string) *MaxWatch {
	w := &MaxWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go w.run(p, period, name, labels)
	return w
}

func (w *MaxWatch) run(p Page, period time.Duration, name string, labels []string) {
	defer close(w.done)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		w.sample(p, name, labels)
		select {
		case <-t.C:
		case <-w.stop:
			w.sample(p, name, labels) // the state at the end counts too
			return
		}
	}
}

func (w *MaxWatch) sample(p Page, name string, labels []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m, err := p.Scrape(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		if w.err == nil {
			w.err = fmt.Errorf("watching %s: %w", name, err)
		}
		return
	}
	v := m.Value(name, labels...)
	if w.samples == 0 || v > w.max {
		w.max = v
	}
	w.samples++
}

// Max returns the largest value and the number of samples so far.
func (w *MaxWatch) Max() (max float64, samples int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.max, w.samples
}

// Stop takes a last sample, ends the watch and returns the largest value,
// the number of good samples and the first failed scrape's error (nil
// when every scrape succeeded). It may be called once.
func (w *MaxWatch) Stop() (max float64, samples int, err error) {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.max, w.samples, w.err
}
