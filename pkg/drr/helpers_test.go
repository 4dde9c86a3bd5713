package drr

import (
	"testing"
)

// class returns a queueing class without limits.
func qclass(name string, quantum uint64, p Policy) ClassConfig {
	return ClassConfig{
		Name:                  name,
		Quantum:               quantum,
		Policy:                p,
		Queueing:              true,
		RequestLimitPerWorker: NoLimit,
		RawISLLimitPerWorker:  NoLimit,
		CachedLimitPerWorker:  NoLimit,
	}
}

func mustNew(t testing.TB, cfgs ...ClassConfig) *Scheduler {
	t.Helper()
	s, err := New(cfgs)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

// enqueue queues r (as if every endpoint were busy) and fails the test if
// the scheduler does not queue it. A zero Pinned means the shared heap:
// tests pin to endpoints >= 1.
func enqueue(t testing.TB, s *Scheduler, r Request) *Item {
	t.Helper()
	if r.Pinned == 0 {
		r.Pinned = NoEndpoint
	}
	it, err := s.Offer(r, Tenant{}, 1, true)
	if err != nil || it == nil {
		t.Fatalf("Offer(%+v) = %v, %v; want a queued item", r, it, err)
	}
	return it
}

// cost returns a request of the given class and scheduling cost.
func costReq(class int, cost uint64, label string) Request {
	return Request{Class: int32(class), Pinned: NoEndpoint, RawISL: cost, Payload: label}
}

// probe is a configurable, counting Probe. Lanes default to Ready.
type probe struct {
	shared      Verdict
	sharedFn    func(class int, it *Item) Verdict
	lanes       map[EndpointID]Verdict
	sharedCalls int
	laneCalls   int
	laneCallsBy map[EndpointID]int
}

func newProbe() *probe {
	return &probe{lanes: map[EndpointID]Verdict{}, laneCallsBy: map[EndpointID]int{}}
}

func (p *probe) Shared(class int, it *Item) Verdict {
	p.sharedCalls++
	if p.sharedFn != nil {
		return p.sharedFn(class, it)
	}
	return p.shared
}

func (p *probe) Lane(class int, ep EndpointID) Verdict {
	p.laneCalls++
	p.laneCallsBy[ep]++
	return p.lanes[ep]
}

// popLabel pops once and returns the label of a dispatched item, or "" for
// None; any other outcome fails the test.
func popLabel(t testing.TB, s *Scheduler, now int64, p Probe) string {
	t.Helper()
	it, out := s.Pop(now, p)
	switch out {
	case None:
		if it != nil {
			t.Fatalf("Pop = %v, None; want nil item", it)
		}
		return ""
	case Dispatch:
		return it.Payload.(string)
	}
	t.Fatalf("Pop outcome = %v; want Dispatch or None", out)
	return ""
}

// drainLabels pops until None and returns the dispatched labels in order.
func drainLabels(t testing.TB, s *Scheduler, now int64, p Probe) []string {
	t.Helper()
	var out []string
	for n := s.Len(); n >= 0; n-- {
		l := popLabel(t, s, now, p)
		if l == "" {
			return out
		}
		out = append(out, l)
	}
	return out
}

func deficits(s *Scheduler) []uint64 {
	st := s.Stats()
	d := make([]uint64, len(st))
	for i := range st {
		d[i] = st[i].Deficit
	}
	return d
}
