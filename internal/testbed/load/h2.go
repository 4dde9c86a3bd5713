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

	"github.com/laneway-dev/laneway/internal/testbed/load/h2client"
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
// gRPC runner sends and the same small SSE response (none when
// cfg.HeaderOnly).
func PlanFor(cfg *Config) (*h2client.Plan, error) {
	spec := specFor(cfg)
	return h2client.NewPlan(h2client.Exchange{
		Path: spec.Path, Headers: spec.Headers, Body: spec.Body,
		ResponseStatus: http.StatusOK, ResponseHeaders: responseHeaders, ResponseBody: responseChunk,
		HeaderOnly: cfg.HeaderOnly,
	})
}

// h2Run is one open-loop run's shared state; callbacks arrive on the
// connections' reader goroutines.
type h2Run struct {
	s       *stats
	begin   []time.Duration // by tag, written before Start
	pending sync.WaitGroup
	// tags, when not nil, counts each stream's answers and ends by its
	// tag (the soak's exactly-once check); guarded by s.mu.
	tags []tagCount
}

// tagCount is what happened to one request of a run.
type tagCount struct {
	started       bool
	answers, ends uint8 // saturating at 2
	failed        bool  // ended with an error
}

func (h *h2Run) decided(tag int, d h2client.Decision) {
	s := h.s
	s.mu.Lock()
	if h.tags != nil {
		h.tags[tag].answers = min(h.tags[tag].answers+1, 2)
	}
	s.lat = append(s.lat, d.Latency)
	if d.Wire > 0 {
		s.wire = append(s.wire, d.Wire)
	}
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

func (h *h2Run) done(tag int, err error) {
	if err != nil {
		h.s.fail(err)
	}
	if h.tags != nil {
		h.s.mu.Lock()
		h.tags[tag].ends = min(h.tags[tag].ends+1, 2)
		h.tags[tag].failed = h.tags[tag].failed || err != nil
		h.s.mu.Unlock()
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
	run := &h2Run{s: newOpenStats(&cfg)}
	if r.Trace != nil {
		run.begin = make([]time.Duration, int(cfg.Rate*cfg.Duration.Seconds()))
		run.s.trace = make([]tracePoint, 0, len(run.begin))
	}

	each := make([]h2client.Options, r.Conns)
	for i := range each {
		each[i].Plan = plan
	}
	conns, err := run.dial(ctx, r.Addr, r.TLS, each, cfg.Hold)
	defer closeAll(conns)
	if err != nil {
		return Result{}, err
	}

	base := &Runner{PickerCPU: r.PickerCPU, Trace: r.Trace}
	res, err := base.openLoop(ctx, &cfg, run.s, func(i int) {
		if run.begin != nil {
			run.begin[i] = time.Since(run.s.t0)
		}
		run.pending.Add(1)
		conns[i%len(conns)].Start(i)
	}, func() { waitOrCancel(ctx, &run.pending, conns) })
	if err != nil {
		return res, fmt.Errorf("open run cancelled: %w", err)
	}
	return res, nil
}

// dial opens one connection per entry of each (its Plan or PlanOf) whose
// streams report to h. On an error the connections already open are
// returned with it, for the caller's closeAll.
func (h *h2Run) dial(ctx context.Context, addr string, cfg *tls.Config, each []h2client.Options, hold time.Duration) ([]*h2client.Conn, error) {
	conns := make([]*h2client.Conn, 0, len(each))
	for _, o := range each {
		o.Hold, o.TLS, o.OnDecision, o.OnDone, o.WireStamps = hold, cfg, h.decided, h.done, true
		c, err := h2client.Dial(ctx, addr, o)
		if err != nil {
			return conns, err
		}
		conns = append(conns, c)
	}
	return conns, nil
}

func closeAll(conns []*h2client.Conn) {
	for _, c := range conns {
		_ = c.Close()
	}
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
