package integration

import (
	"strings"
	"testing"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

// TestDPRankBounds: each port of a host is one data-parallel rank (the
// order --endpoints lists them), and x-laneway-dp-rank bounds a request
// to a rank or a range of them (SPEC §5); a bound no endpoint meets is a
// 503 naming the filter, and a malformed one is ignored.
func TestDPRankBounds(t *testing.T) {
	launch.CheckGoroutines(t)
	const r0, r1, r2 = "127.0.0.2:8000", "127.0.0.2:8001", "127.0.0.2:8002"
	p := startEPP(t, launch.EPPOptions{Endpoints: []string{r0, r1, r2}})
	c := p.Client(t, extprocclient.Options{})
	route := func(rank string) string {
		ex := mustStart(t, c, spec(tokens(10, 1), "x-laneway-dp-rank", rank))
		defer completeStream(t, ex)
		return mustRoute(t, ex)
	}
	for i := range 6 {
		if got := route("1"); got != r1 {
			t.Fatalf("request %d bounded to rank 1 went to %s, want %s", i, got, r1)
		}
		if got := route("1-2"); got != r1 && got != r2 {
			t.Fatalf("request %d bounded to ranks 1-2 went to %s", i, got)
		}
	}
	// Malformed: ignored, so rank 0 takes its share of the random
	// tie-breaks; 200 tries miss it with probability (2/3)^200.
	seen := map[string]bool{}
	for i := 0; i < 200 && !seen[r0]; i++ {
		seen[route("1 - x")] = true
	}
	if !seen[r0] {
		t.Errorf("with a malformed bound, 200 requests never reached rank 0: %v", seen)
	}
	ex := mustStart(t, c, spec(tokens(10, 2), "x-laneway-dp-rank", "5"))
	ir := immediate(t, ex, 503, "no_endpoints")
	if !strings.Contains(string(ir.Body), "no endpoint has a data-parallel rank in 5-5") {
		t.Errorf("503 body %s does not name the rank filter", ir.Body)
	}
}
