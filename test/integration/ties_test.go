package integration

import (
	"testing"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

// TestLeastLoadedBreaksTiesAtRandom: with --picker least-loaded, equally
// loaded endpoints share the requests instead of the first address taking
// them all (the prefix picker already breaks ties at random).
func TestLeastLoadedBreaksTiesAtRandom(t *testing.T) {
	launch.CheckGoroutines(t)
	eps := []string{"127.0.0.2:8000", "127.0.0.3:8000", "127.0.0.4:8000", "127.0.0.5:8000"}
	p := startEPP(t, launch.EPPOptions{Endpoints: eps, Args: []string{"--picker=least-loaded"}})
	c := p.Client(t, extprocclient.Options{})
	const n = 400
	count := map[string]int{}
	for i := range n {
		ex := mustStart(t, c, spec(tokens(10, i)))
		count[mustRoute(t, ex)]++
		completeStream(t, ex) // every endpoint idle again: a four-way tie
	}
	t.Logf("requests per endpoint: %v", count)
	for _, e := range eps {
		// Binomial(400, 1/4): mean 100, standard deviation 8.7.
		if count[e] < 60 || count[e] > 140 {
			t.Errorf("%s took %d of %d tied requests, want about %d", e, count[e], n, n/len(eps))
		}
	}
}
