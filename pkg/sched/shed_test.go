package sched

import (
	"errors"
	"testing"
	"time"
)

// TestWaitBudgetShedding runs SPEC §5's deadline shedding through the core
// on a fake clock: the head of a class with a wait budget leaves with a
// ShedError carrying exactly how long it waited, without charging its
// class's deficit or moving the ring cursor, and what is queued behind it
// is served in the order it would have been anyway.
func TestWaitBudgetShedding(t *testing.T) {
	const ep = "127.0.0.2:8000"
	c := newCore(t, byHeader(100, class("a", 100, 2*time.Second), class("b", 100, 0)), Options{}, ep)

	big := admit(c, ms(0), &Ticket{ClassHeader: "a", RawISL: 150}) // direct; the endpoint is busy after it
	if l := c.Drain(ms(0)); len(l) != 1 || l[0].Grant == nil {
		t.Fatalf("first request: %v, want a direct grant", l)
	}
	a1 := admit(c, ms(100), &Ticket{ClassHeader: "a", RawISL: 50})
	a2 := admit(c, ms(900), &Ticket{ClassHeader: "a", RawISL: 50})
	b1 := admit(c, ms(200), &Ticket{ClassHeader: "b", RawISL: 50})
	if l := c.Drain(ms(900)); len(l) != 0 {
		t.Fatalf("behind a busy endpoint: %d decisions, want none", len(l))
	}
	if at, ok := c.NextDeadline(); !ok || at != ms(2100) {
		t.Fatalf("NextDeadline = %d, %t; want a1's expiry at %d", at, ok, ms(2100))
	}
	if l := c.Drain(ms(2099)); len(l) != 0 {
		t.Fatalf("1 ms before the budget ran out: %v", l)
	}

	l := c.Drain(ms(2350))
	if len(l) != 1 || l[0].Req != a1 {
		t.Fatalf("at 2.35 s: %d decisions, want a1 shed", len(l))
	}
	var shed *ShedError
	if !errors.As(l[0].Err, &shed) || l[0].Reason != ReasonShed || l[0].Grant != nil {
		t.Fatalf("a1 left with %s, want a ShedError", leaveString(l[0]))
	}
	if *shed != (ShedError{Class: "a", Waited: 2250 * time.Millisecond, Budget: 2 * time.Second}) {
		t.Fatalf("shed = %+v, want class a, waited 2.25 s of 2 s", *shed)
	}
	for _, s := range c.Snapshot().Classes {
		if s.Deficit != 0 {
			t.Fatalf("class %s deficit %d after a shed, want 0 (nothing charged)", s.Name, s.Deficit)
		}
	}
	if c.Len() != 2 {
		t.Fatalf("%d queued, want a2 and b1", c.Len())
	}

	// The endpoint frees up: the cursor is still on class a, so a2 goes
	// before b1 (had the shed moved the cursor, b1 would be first).
	c.Release(big.Grant(), EventFirstByte)
	l = c.Drain(ms(2400))
	if len(l) != 2 || l[0].Req != a2 || l[1].Req != b1 {
		var got []string
		for _, x := range l {
			got = append(got, leaveString(x))
		}
		t.Fatalf("after the release: %q, want a2 then b1", got)
	}
	if l[0].Wait != 1500*time.Millisecond || !l[0].Queued {
		t.Fatalf("a2 waited %s (queued %t), want 1.5 s", l[0].Wait, l[0].Queued)
	}
}
