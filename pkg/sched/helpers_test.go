package sched

import (
	"fmt"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/pkg/drr"
	"github.com/laneway-dev/laneway/pkg/policy"
)

// ms is a fake-clock reading: n milliseconds after the clock's zero.
func ms(n int64) int64 { return n * int64(time.Millisecond) }

// class is an fcfs class with quantum q and a busy threshold (none when 0).
func class(name string, q uint64, budget time.Duration) drr.ClassConfig {
	return drr.ClassConfig{Name: name, Quantum: q, Policy: drr.FCFS, Queueing: true, WaitBudget: budget,
		RequestLimitPerWorker: drr.NoLimit, RawISLLimitPerWorker: drr.NoLimit, CachedLimitPerWorker: drr.NoLimit}
}

// byHeader is a policy whose classes are named by the ticket's class
// header (unknown names: class 0), each with the same busy threshold.
func byHeader(threshold uint64, classes ...drr.ClassConfig) *Policy {
	rule := policy.BusyTest{Threshold: threshold, HasThreshold: threshold > 0}
	p := &Policy{Classes: classes}
	for i := range classes {
		p.Classes[i].Queueing = threshold > 0
		p.Busy = append(p.Busy, rule)
	}
	p.Resolve = func(t *Ticket) int {
		for i, c := range p.Classes {
			if c.Name == t.ClassHeader {
				return i
			}
		}
		return 0
	}
	return p
}

func newCore(t testing.TB, p *Policy, o Options, addrs ...string) *Core {
	t.Helper()
	c, err := New(p, o)
	if err != nil {
		t.Fatal(err)
	}
	c.SetEndpoints(0, endpoints(addrs...))
	if l := c.Drain(0); len(l) != 0 {
		t.Fatalf("setting endpoints decided %d requests", len(l))
	}
	return c
}

func endpoints(addrs ...string) []Endpoint {
	out := make([]Endpoint, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, Endpoint{Addr: a, MaxBatchedTokens: 8192})
	}
	return out
}

// admit admits a fresh request at now and returns it.
func admit(c *Core, now int64, t *Ticket) *Request {
	r := new(Request)
	r.Reset(t, nil)
	c.Admit(now, r)
	return r
}

// leaveString is a one-line description of a decision for test failures.
func leaveString(l Leave) string {
	if l.Grant != nil {
		return fmt.Sprintf("%s granted %v (queued %t, waited %s)", l.Class, l.Grant.Endpoints, l.Queued, l.Wait)
	}
	return fmt.Sprintf("%s %s: %v", l.Class, l.Reason, l.Err)
}
