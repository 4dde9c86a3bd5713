package integration

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/internal/testbed/workload"
)

const (
	perClass    = 320
	promptLen   = 512
	serverSlots = 4
	// serviceTime is how long the simulated model server holds a slot
	// before the first response byte: it models prefill, it does not
	// synchronise anything.
	serviceTime = 2 * time.Millisecond
)

// fifoSlots is the simulated model server's concurrency: a request takes a
// slot, or waits for one in arrival order.
type fifoSlots struct {
	mu    sync.Mutex
	free  int
	queue []chan struct{}
}

func (s *fifoSlots) acquire(ctx context.Context) error {
	s.mu.Lock()
	if s.free > 0 && len(s.queue) == 0 {
		s.free--
		s.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	s.queue = append(s.queue, ch)
	s.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err() // the run is being torn down; the slot no longer matters
	}
}

func (s *fifoSlots) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) > 0 {
		close(s.queue[0])
		s.queue = s.queue[1:]
		return
	}
	s.free++
}

// shareStats are the observed numbers of one weighted-share run.
type shareStats struct {
	premiumFirst320, regularFirst320 int
	// regularLeftAtPremiumDrain is how many regular requests had not
	// completed when the last premium request completed.
	regularLeftAtPremiumDrain int
	regularAtPremium80        int
	regularGain80to240        int
}

func analyse(order []string) shareStats {
	var s shareStats
	premium, regular := 0, 0
	regularAt240 := -1
	for i, c := range order {
		if c == "premium" {
			premium++
		} else {
			regular++
		}
		if i == 319 {
			s.premiumFirst320, s.regularFirst320 = premium, regular
		}
		if c == "premium" {
			switch premium {
			case 80:
				s.regularAtPremium80 = regular
			case 240:
				regularAt240 = regular
			case perClass:
				s.regularLeftAtPremiumDrain = perClass - regular
			}
		}
	}
	s.regularGain80to240 = regularAt240 - s.regularAtPremium80
	return s
}

// runWeightedShare drives SPEC §11's workload through the real picker: 320
// distinct 512-token prompts per class, interleaved and released together,
// against one endpoint whose 4 slots the test simulates. It returns the
// classes in completion order.
func runWeightedShare(t *testing.T, premiumQ, regularQ int) []string {
	t.Helper()
	bs := startBackends(t, 1)
	p := startEPP(t, launch.EPPOptions{
		Endpoints: addrs(bs),
		Policy:    writePolicy(t, workload.PolicyYAML(uint64(premiumQ), uint64(regularQ))),
		Args:      []string{"--max-num-batched-tokens=8192"},
	})
	// Two connections, as a gateway with two workers would hold.
	clients := []*extprocclient.Client{p.Client(t, extprocclient.Options{}), p.Client(t, extprocclient.Options{})}

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	slots := &fifoSlots{free: serverSlots}
	// gate holds the simulated server until every request has reached the
	// picker, so "released together" does not depend on how fast this
	// process can open 640 streams.
	gate := make(chan struct{})
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		order []string
		fails []string
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		fails = append(fails, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	defer func() {
		cancel()
		wg.Wait()
	}()
	for i := 0; i < 2*perClass; i++ {
		class := "premium"
		if i%2 == 1 {
			class = "regular"
		}
		body := tokens(promptLen, i+1)
		c := clients[i%len(clients)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			ex, err := c.Start(ctx, spec(body, "x-dynamo-meta-policy-class", class))
			if err != nil {
				fail("%s request %d: %v", class, i, err)
				return
			}
			defer ex.Close()
			if d := ex.Decision(); !d.Routed() {
				fail("%s request %d answered %d %s", class, i, d.Immediate.Status, d.Immediate.Body)
				return
			}
			if err := slots.acquire(ctx); err != nil {
				fail("%s request %d: waiting for a slot: %v", class, i, err)
				return
			}
			defer slots.release()
			select {
			case <-gate:
			case <-ctx.Done():
				fail("%s request %d: run cancelled before the server opened", class, i)
				return
			}
			time.Sleep(serviceTime)
			if _, err := ex.SendResponseHeaders(http.StatusOK, http.Header{"content-type": {"text/event-stream"}}, false, ""); err != nil {
				fail("%s request %d: response headers: %v", class, i, err)
				return
			}
			if _, err := ex.SendResponseBody([]byte("data: {\"choices\":[{\"text\":\"x\"}]}\n\ndata: [DONE]\n\n"), true); err != nil {
				fail("%s request %d: response body: %v", class, i, err)
				return
			}
			mu.Lock()
			order = append(order, class)
			mu.Unlock()
		}()
	}
	// The picker dispatches the first serverSlots requests at once (4 ×
	// 512 crosses the 1536 threshold only with the 4th) and queues the rest.
	want := float64(2*perClass - serverSlots)
	var pending float64
	launch.WaitFor(t, func() string { return fmt.Sprintf("queued %v, want %v", pending, want) }, func() bool {
		pending = p.Metrics.Value(t, "dynamo_frontend_router_queue_pending_requests")
		mu.Lock()
		failed := len(fails) > 0
		mu.Unlock()
		return pending == want || failed
	})
	close(gate)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(fails) > 0 {
		t.Fatalf("%d of %d requests failed; first: %s", len(fails), 2*perClass, fails[0])
	}
	if len(order) != 2*perClass {
		t.Fatalf("%d completions, want %d", len(order), 2*perClass)
	}
	if n := p.Metrics.Value(t, "dynamo_frontend_router_queue_backpressure_total"); n != 0 {
		t.Errorf("backpressure counter = %v, want no 429/503", n)
	}
	return append([]string(nil), order...)
}

// TestWeightedShare is SPEC §11's weighted-share acceptance workload with
// quanta 512:128 (about 4:1) and 512:512 (about 1:1).
func TestWeightedShare(t *testing.T) {
	launch.CheckGoroutines(t)
	t.Run("512:128", func(t *testing.T) {
		s := analyse(runWeightedShare(t, 512, 128))
		t.Logf("quanta 512:128: first 320 completions premium %d regular %d; regular left at premium drain %d; "+
			"regular at premium #80 %d; regular gained %d between premium #80 and #240",
			s.premiumFirst320, s.regularFirst320, s.regularLeftAtPremiumDrain, s.regularAtPremium80, s.regularGain80to240)
		if s.premiumFirst320 < 240 || s.regularFirst320 < 48 {
			t.Errorf("first 320: premium %d (want >= 240), regular %d (want >= 48)", s.premiumFirst320, s.regularFirst320)
		}
		if s.regularLeftAtPremiumDrain < 220 || s.regularLeftAtPremiumDrain > 260 {
			t.Errorf("regular left at premium drain %d, want within [220,260]", s.regularLeftAtPremiumDrain)
		}
		if s.regularAtPremium80 < 12 {
			t.Errorf("regular completions when premium reached 80: %d, want >= 12", s.regularAtPremium80)
		}
		if s.regularGain80to240 < 32 {
			t.Errorf("regular gained %d between premium #80 and #240, want >= 32", s.regularGain80to240)
		}
	})
	t.Run("512:512", func(t *testing.T) {
		s := analyse(runWeightedShare(t, 512, 512))
		t.Logf("quanta 512:512: first 320 completions premium %d regular %d; regular left at premium drain %d",
			s.premiumFirst320, s.regularFirst320, s.regularLeftAtPremiumDrain)
		if s.premiumFirst320 < 140 || s.premiumFirst320 > 180 {
			t.Errorf("premium in the first 320: %d, want within [140,180]", s.premiumFirst320)
		}
		if s.regularLeftAtPremiumDrain > 20 {
			t.Errorf("regular left at premium drain %d, want <= 20", s.regularLeftAtPremiumDrain)
		}
	})
}

// TestAnalyse checks the band arithmetic on a synthetic ideal 4:1 order.
func TestAnalyse(t *testing.T) {
	var order []string
	for len(order) < 400 {
		order = append(order, "premium", "premium", "premium", "premium", "regular")
	}
	for len(order) < 640 {
		order = append(order, "regular")
	}
	got := analyse(order)
	want := shareStats{premiumFirst320: 256, regularFirst320: 64, regularLeftAtPremiumDrain: 241, regularAtPremium80: 19, regularGain80to240: 40}
	if got != want {
		t.Errorf("analyse = %+v, want %+v", got, want)
	}
}
