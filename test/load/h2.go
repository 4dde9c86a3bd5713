package load

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/laneway-dev/laneway/test/load/h2client"
)

// H2Runner drives the open loop through h2client, the event-driven gateway:
// no goroutine per request, each request's messages encoded once per run.
// It is the default for latency runs because a load tool that shares the
// CPU with the picker must not be the tail it measures (see package
// h2client).
type H2Runner struct {
	// Addr is the picker's ext_proc address.
	Addr string
	// TLS, when set, speaks TLS; nil is cleartext HTTP/2.
	TLS *tls.Config
	// Conns is the number of HTTP/2 connections (a gateway holds about one
	// per worker); at least 1.
	Conns int
	// PickerCPU and Trace are as in Runner.
	PickerCPU CPUSampler
	Trace     io.Writer
}

// PlanFor is the exchange every stream of cfg plays: the same request the
// gRPC runner sends and the same small SSE response.
func PlanFor(cfg *Config) (*h2client.Plan, error) {
	spec := specFor(cfg)
	return h2client.NewPlan(h2client.Exchange{
		Path: spec.Path, Headers: spec.Headers, Body: spec.Body,
		ResponseStatus: http.StatusOK, ResponseHeaders: responseHeaders, ResponseBody: responseChunk,
	})
}

// h2Run is one open-loop run's shared state; callbacks arrive on the
// connections' reader goroutines.
type h2Run struct {
	s       *stats
	begin   []time.Duration // by tag, written before Start
	pending sync.WaitGroup
}

func (h *h2Run) decided(tag int, d h2client.Decision) {
	s := h.s
	s.mu.Lock()
	s.lat = append(s.lat, d.Latency)
	if h.begin != nil {
		s.trace = append(s.trace, tracePoint{h.begin[tag], d.Latency})
	}
	if d.Status == 0 {
		s.routed++
	} else {
		s.immediate++
		s.byStatus[d.Status]++
	}
	s.mu.Unlock()
}

func (h *h2Run) done(_ int, err error) {
	if err != nil {
		h.s.fail(err)
	}
	h.s.leave()
	h.pending.Done()
}

// RunOpen runs the open loop of SPEC §13 and waits for every stream to end.
func (r *H2Runner) RunOpen(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.Validate(false); err != nil {
		return Result{}, err
	}
	if r.Conns < 1 {
		return Result{}, errors.New("load: H2Runner.Conns must be at least 1")
	}
	plan, err := PlanFor(&cfg)
	if err != nil {
		return Result{}, err
	}
	capN := cfg.ConcurrencyCap
	if capN == 0 {
		capN = MaxConcurrency
	}
	total := int(cfg.Rate * cfg.Duration.Seconds())
	interval := time.Duration(float64(time.Second) / cfg.Rate)
	run := &h2Run{s: &stats{byStatus: map[int]int{}, lat: make([]time.Duration, 0, total)}}
	if r.Trace != nil {
		run.begin = make([]time.Duration, total)
		run.s.trace = make([]tracePoint, 0, total)
	}

	conns := make([]*h2client.Conn, 0, r.Conns)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range r.Conns {
		c, err := h2client.Dial(ctx, r.Addr, h2client.Options{
			Plan: plan, Hold: cfg.Hold, TLS: r.TLS, OnDecision: run.decided, OnDone: run.done,
		})
		if err != nil {
			return Result{}, err
		}
		conns = append(conns, c)
	}

	base := &Runner{PickerCPU: r.PickerCPU, Trace: r.Trace}
	res := Result{Mode: "open", Rate: cfg.Rate, Hold: cfg.Hold, Duration: cfg.Duration}
	cpu0, cpuOK := base.sampleCPU()
	self0 := selfCPU()
	start := time.Now()
	run.s.t0 = start
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	var lastArrival time.Time
	for i := 0; i < total; i++ {
		due := start.Add(time.Duration(i) * interval)
		if wait := time.Until(due); wait > 0 {
			t.Reset(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			break
		}
		lastArrival = time.Now()
		if lag := lastArrival.Sub(due); lag > res.MaxLag {
			res.MaxLag = lag
		}
		if int(run.s.open.Load()) >= capN {
			res.Skipped++
			continue
		}
		res.Started++
		run.s.enter()
		if run.begin != nil {
			run.begin[i] = lastArrival.Sub(start)
		}
		run.pending.Add(1)
		conns[i%len(conns)].Start(i)
	}
	window := lastArrival.Sub(start)
	waitOrCancel(ctx, &run.pending, conns)
	res.Elapsed = time.Since(start)
	base.finish(&res, run.s, cpu0, cpuOK, self0)
	if window > 0 {
		res.DecisionsPerSec = float64(res.Routed+res.Immediate) / (window + interval).Seconds()
	}
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("open run cancelled: %w", err)
	}
	return res, nil
}

// waitOrCancel waits for every stream; a cancelled ctx closes the
// connections, which ends the streams still open.
func waitOrCancel(ctx context.Context, wg *sync.WaitGroup, conns []*h2client.Conn) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		for _, c := range conns {
			_ = c.Close()
		}
		<-done
	}
}
