package dispatcher

import (
	"github.com/laneway-dev/laneway/pkg/drr"
	"github.com/laneway-dev/laneway/pkg/podmetrics"
	"github.com/laneway-dev/laneway/pkg/policy"
	"github.com/laneway-dev/laneway/pkg/sched"
)

// The control-plane calls: endpoint sets, scrapes, policy swaps, snapshots
// and shutdown, each run on the loop as a function (none is on the
// per-request path).

// call runs fn on the loop and waits until it ran, or reports false when
// the loop stopped first. A command sent runs even when the loop stops
// meanwhile (Run answers late commands).
func (d *Dispatcher) call(fn func()) bool {
	ran := make(chan struct{})
	if !d.send(command{fn: func() { fn(); close(ran) }}) {
		return false
	}
	<-ran
	return true
}

// SetEndpoints replaces the endpoint set (sched.Core.SetEndpoints).
func (d *Dispatcher) SetEndpoints(eps []sched.Endpoint) {
	cp := append([]sched.Endpoint(nil), eps...)
	if d.send(command{fn: func() { d.core.SetEndpoints(d.now(), cp) }}) && d.onEps != nil {
		d.onEps(cp)
	}
}

// SetEndpointMetrics delivers a scrape of the endpoint at addr
// (sched.Core.SetMetrics); it implements podmetrics.Sink.
func (d *Dispatcher) SetEndpointMetrics(addr string, m podmetrics.Metrics, stale bool) {
	d.send(command{scrape: func() bool {
		changed := d.core.SetMetrics(d.now(), addr, m, stale)
		d.publishBlockSize() // the engine's block size may have come with it
		return changed
	}})
}

// BlockSize is the block size, in tokens, at which request parsers should
// hash prompts for the prefix index (sched.Core.BlockSize). Safe for
// concurrent use.
func (d *Dispatcher) BlockSize() int { return int(d.hashBS.Load()) }

// SetPolicy swaps the class table without losing or reordering queued
// requests (sched.Core.SetPolicy). An invalid policy is refused and the
// old one stays in force.
func (d *Dispatcher) SetPolicy(p *sched.Policy) error {
	if err := p.Validate(); err != nil {
		return err
	}
	var err error
	if !d.call(func() { err = d.core.SetPolicy(p) }) {
		return sched.ErrShuttingDown
	}
	if err == nil {
		d.identity.Store(p.Identity)
	}
	return err
}

// Identity is the identity source of the policy in force (nil: none, the
// x-laneway-tenant header names the tenant). Safe for concurrent use.
func (d *Dispatcher) Identity() *policy.Identity { return d.identity.Load() }

// Snapshot returns the queue and endpoint state (for metrics and status).
func (d *Dispatcher) Snapshot() (s sched.Snapshot, ok bool) {
	ok = d.call(func() { s = d.core.Snapshot() })
	return s, ok
}

// Status is a Snapshot with each class's tenants that queue the most
// tokens (same order as Snapshot.Classes), for the status page.
type Status struct {
	sched.Snapshot
	TopTenants [][]drr.TenantStats
}

// Status returns the Snapshot and up to topN tenants per class.
func (d *Dispatcher) Status(topN int) (st Status, ok bool) {
	ok = d.call(func() {
		st.Snapshot = d.core.Snapshot()
		st.TopTenants = make([][]drr.TenantStats, len(st.Classes))
		for i := range st.Classes {
			st.TopTenants[i] = d.core.TopTenants(i, topN)
		}
	})
	return st, ok
}

// Shutdown stops admitting: queued requests and every later Acquire are
// answered with ErrShuttingDown. Dispatched requests keep their grants.
func (d *Dispatcher) Shutdown() { d.call(func() { d.core.Shutdown(d.now()) }) }
