package dispatcher

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/pkg/sched"
)

// offerAsync offers tk and returns the handle and the channel its one
// answer lands on.
func offerAsync(d *Dispatcher, tk *sched.Ticket) (*Offered, <-chan result) {
	ch := make(chan result, 2) // room for a second answer, which would fail the test
	o := d.Offer(tk, func(g *sched.Grant, err error) { ch <- result{g, err} })
	return o, ch
}

// answer receives the one answer of an offer.
func answer(t *testing.T, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("an offered ticket was not answered")
		return result{}
	}
}

func TestOfferAnswersOnce(t *testing.T) {
	d := startDispatcher(t, twoClassPolicy(512, 128, 1024), "127.0.0.2:8000")

	// Granted at once.
	_, ch := offerAsync(d, &sched.Ticket{ClassHeader: "premium", RawISL: 4000})
	busy := answer(t, ch)
	if busy.err != nil || busy.g == nil {
		t.Fatalf("first offer: %+v", busy)
	}

	// Queued behind it: a ticket that waited 2 s elsewhere goes before
	// one offered earlier that did not.
	// Each fills the endpoint (the busy threshold is 1,536 tokens).
	_, later := offerAsync(d, &sched.Ticket{ClassHeader: "premium", RawISL: 2000})
	waitQueued(t, d, 1)
	_, earlier := offerAsync(d, &sched.Ticket{ClassHeader: "premium", RawISL: 2000, Waited: 2 * time.Second})
	waitQueued(t, d, 2)
	busy.g.Done()
	first := answer(t, earlier)
	if first.err != nil {
		t.Fatal(first.err)
	}
	select {
	case r := <-later:
		t.Fatalf("the ticket offered first but arrived later was granted before the re-offered one: %+v", r)
	default:
	}
	first.g.Done()
	second := answer(t, later)
	if second.err != nil {
		t.Fatal(second.err)
	}

	// Cancelled while queued: it leaves with ErrCancelled.
	o, ch := offerAsync(d, &sched.Ticket{ClassHeader: "premium", RawISL: 100})
	waitQueued(t, d, 1)
	d.Cancel(o)
	if r := answer(t, ch); !errors.Is(r.err, sched.ErrCancelled) {
		t.Fatalf("cancelled while queued: %+v, want ErrCancelled", r)
	}

	// Cancelled after its grant: the grant is released.
	second.g.Done()
	o, ch = offerAsync(d, &sched.Ticket{ClassHeader: "premium", RawISL: 100})
	if r := answer(t, ch); r.err != nil {
		t.Fatal(r.err)
	}
	d.Cancel(o)
	s, _ := d.Snapshot()
	if e := s.Endpoints[0]; e.InFlight != 0 || e.ActivePrefill != 0 {
		t.Fatalf("a grant cancelled after it was made is still charged: %+v", e)
	}
	select {
	case r := <-ch:
		t.Fatalf("an offer was answered twice: %+v", r)
	default:
	}
}

func TestOfferAfterStopAnswersOnTheCaller(t *testing.T) {
	d, err := New(twoClassPolicy(512, 128, 1024), Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go d.Run(ctx)
	cancel()
	<-d.done
	var got error
	d.Offer(&sched.Ticket{RawISL: 1}, func(_ *sched.Grant, err error) { got = err })
	if !errors.Is(got, sched.ErrShuttingDown) {
		t.Fatalf("offer after the loop stopped: %v, want ErrShuttingDown before Offer returns", got)
	}
}

// TestOffersRacingTheStopAreAnsweredOnce: offers and acquisitions made
// while the loop stops are each answered exactly once, none lost in the
// command channel.
func TestOffersRacingTheStopAreAnsweredOnce(t *testing.T) {
	for range 20 {
		d, err := New(twoClassPolicy(512, 128, 1024), Options{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		go d.Run(ctx)
		const n = 200
		var answered sync.WaitGroup
		answered.Add(n)
		var twice atomic.Int32
		for i := range n {
			go func() {
				var once atomic.Bool
				d.Offer(&sched.Ticket{RawISL: uint64(i)}, func(*sched.Grant, error) {
					if !once.CompareAndSwap(false, true) {
						twice.Add(1)
					}
					answered.Done()
				})
			}()
		}
		cancel()
		waited := make(chan struct{})
		go func() { answered.Wait(); close(waited) }()
		select {
		case <-waited:
		case <-time.After(10 * time.Second):
			t.Fatal("an offer made while the loop stopped was never answered")
		}
		if twice.Load() != 0 {
			t.Fatalf("%d offers answered twice", twice.Load())
		}
	}
}
