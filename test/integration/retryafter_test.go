package integration

import (
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

// retryAfter asserts a direct answer with status and reason and returns
// its retry-after header in seconds.
func retryAfter(t *testing.T, ex *extprocclient.Exchange, status int, reason string) int {
	t.Helper()
	ir := immediate(t, ex, status, reason)
	v := ir.Headers.Get("retry-after")
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%d %s: retry-after %q, want whole seconds >= 1 (headers %v)", status, reason, v, ir.Headers)
	}
	return n
}

// TestRetryAfter: every 429 and 503 the picker answers carries a
// retry-after header in whole seconds (SPEC §15): from the class's
// queue-wait estimate (the last minute's median wait of its queued
// requests) where the class has one, else --retry-after.
func TestRetryAfter(t *testing.T) {
	launch.CheckGoroutines(t)
	const dflt = 7 // --retry-after, distinct from any estimate below
	flag := "--retry-after=" + strconv.Itoa(dflt) + "s"
	ctx := testCtx(t)

	t.Run("flag default is 1s", func(t *testing.T) {
		p := startEPP(t, launch.EPPOptions{Endpoints: []string{"127.0.0.2:8000"}})
		ex := mustStart(t, p.Client(t, extprocclient.Options{}), pinned(spec(tokens(8, 1)), "127.0.0.99:9"))
		if got := retryAfter(t, ex, http.StatusServiceUnavailable, "no_endpoints"); got != 1 {
			t.Errorf("retry-after %d, want 1", got)
		}
	})

	t.Run("no endpoint", func(t *testing.T) {
		p := startEPP(t, launch.EPPOptions{Endpoints: []string{"127.0.0.2:8000"}, Args: []string{flag}})
		ex := mustStart(t, p.Client(t, extprocclient.Options{}), pinned(spec(tokens(8, 1)), "127.0.0.99:9"))
		if got := retryAfter(t, ex, http.StatusServiceUnavailable, "no_endpoints"); got != dflt {
			t.Errorf("retry-after %d, want the flag's %d", got, dflt)
		}
	})

	t.Run("held bytes", func(t *testing.T) {
		p := startEPP(t, launch.EPPOptions{Endpoints: []string{"127.0.0.2:8000"},
			Args: []string{flag, "--max-body-bytes=2000", "--max-held-body-bytes=2000"}})
		// A slow client holds 1600 bytes of the budget: the buffer of what
		// it sent of its body, sized by its content-length.
		body := paddedBody(1600)
		tr := startTrickler(ctx, t, extprocv3.NewExternalProcessorClient(p.Conn(t)), body, "127.0.0.2:8000")
		defer tr.cancel()
		tr.send(body[:1500], false)
		p.Metrics.Await(t, 1600, "laneway_held_body_bytes")
		ex := mustStart(t, p.Client(t, extprocclient.Options{}), spec(paddedBody(1000)))
		if got := retryAfter(t, ex, http.StatusTooManyRequests, "held_bytes"); got != dflt {
			t.Errorf("retry-after %d, want the flag's %d", got, dflt)
		}
	})

	t.Run("queue limit, then the class's estimate", func(t *testing.T) {
		p := startEPP(t, launch.EPPOptions{Endpoints: []string{"127.0.0.2:8000"}, Policy: writePolicy(t, busyPolicy), Args: []string{flag}})
		c := p.Client(t, extprocclient.Options{})
		holder := mustStart(t, c, spec(tokens(500, 0)))
		mustRoute(t, holder)
		queued := make(chan started, 9)
		firstQueued := time.Now()
		for i := range 8 { // busyPolicy's limit for one endpoint
			startInto(ctx, c, "queued", spec(tokens(150, i+1)), queued)
			p.Metrics.Await(t, float64(i+1), "dynamo_frontend_router_queue_pending_requests", "policy_class", "standard")
		}
		// No request of the class has waited yet: the flag's value.
		if got := retryAfter(t, mustStart(t, c, spec(tokens(150, 20))), http.StatusTooManyRequests, "queue_limit"); got != dflt {
			t.Errorf("before any wait: retry-after %d, want the flag's %d", got, dflt)
		}
		// One queued request is granted after waiting at most waited.
		completeStream(t, holder)
		next := await(t, queued)
		mustRoute(t, next.ex)
		waited := time.Since(firstQueued)
		startInto(ctx, c, "queued", spec(tokens(150, 21)), queued)
		p.Metrics.Await(t, 8, "dynamo_frontend_router_queue_pending_requests", "policy_class", "standard")
		// The picker reads a class's estimate at most once a second, so
		// the next 429s may still say the flag's value for that long.
		got, seed := dflt, 22
		launch.WaitFor(t, func() string { return fmt.Sprintf("retry-after %d, the flag's value, after a queued grant", got) }, func() bool {
			seed++
			got = retryAfter(t, mustStart(t, c, spec(tokens(150, seed))), http.StatusTooManyRequests, "queue_limit")
			return got != dflt
		})
		// The median wait is rounded up to its histogram bucket (at most
		// twice the wait) and then to whole seconds.
		if maxEst := int(math.Ceil(2 * waited.Seconds())); got > maxEst {
			t.Errorf("after a wait of at most %s: retry-after %d, want the estimate (1..%d)", waited, got, maxEst)
		}
		holder = next.ex
		for range 8 {
			completeStream(t, holder)
			n := await(t, queued)
			mustRoute(t, n.ex)
			holder = n.ex
		}
		completeStream(t, holder)
	})

	t.Run("tenant limits", func(t *testing.T) {
		p := startEPP(t, launch.EPPOptions{Endpoints: []string{"127.0.0.2:8000"}, Args: []string{flag}, Policy: writePolicy(t, `
tenants:
  - {name: small, match: {exact: [small]}, request_queue_limit: 1}
policy_classes:
  - {name: shared, quantum: 100, prefill_busy_threshold: 100, tenant_fairness: true, max_tenants: 1}
`)})
		c := p.Client(t, extprocclient.Options{})
		holder := mustStart(t, c, spec(tokens(500, 0)))
		mustRoute(t, holder)
		queued := make(chan started, 1)
		startInto(ctx, c, "small", spec(tokens(150, 1), "x-laneway-tenant", "small"), queued)
		p.Metrics.Await(t, 1, "dynamo_frontend_router_queue_pending_requests", "policy_class", "shared")
		for _, who := range []string{"small", "carol"} { // the tenant's limit, then the class's tenant bound
			if got := retryAfter(t, mustStart(t, c, spec(tokens(150, 2), "x-laneway-tenant", who)), http.StatusTooManyRequests, "queue_limit"); got != dflt {
				t.Errorf("%s: retry-after %d, want the flag's %d", who, got, dflt)
			}
		}
		completeStream(t, holder)
		n := await(t, queued)
		mustRoute(t, n.ex)
		completeStream(t, n.ex)
	})

	t.Run("shed", func(t *testing.T) {
		p := startEPP(t, launch.EPPOptions{Endpoints: []string{"127.0.0.2:8000"}, Args: []string{flag}, Policy: writePolicy(t, `
policy_classes:
  - {name: standard, quantum: 1, prefill_busy_threshold: 100, max_queue_wait: 100ms}
`)})
		c := p.Client(t, extprocclient.Options{})
		holder := mustStart(t, c, spec(tokens(500, 0)))
		mustRoute(t, holder)
		shed := await(t, startAsync(ctx, c, "shed", spec(tokens(150, 1))))
		if got := retryAfter(t, shed.ex, http.StatusTooManyRequests, "shed"); got != dflt {
			t.Errorf("retry-after %d, want the flag's %d (a shed request is no queued grant)", got, dflt)
		}
		completeStream(t, holder)
	})

	t.Run("shutting down", func(t *testing.T) {
		p := startEPP(t, launch.EPPOptions{Endpoints: []string{"127.0.0.2:8000"}, Policy: writePolicy(t, busyPolicy), Args: []string{flag}})
		c := p.Client(t, extprocclient.Options{})
		holder := mustStart(t, c, spec(tokens(500, 0)))
		mustRoute(t, holder)
		queued := startAsync(ctx, c, "queued", spec(tokens(150, 1)))
		p.Metrics.Await(t, 1, "dynamo_frontend_router_queue_pending_requests", "policy_class", "standard")
		if err := p.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if got := retryAfter(t, await(t, queued).ex, http.StatusServiceUnavailable, "shutting_down"); got != dflt {
			t.Errorf("retry-after %d, want the flag's %d", got, dflt)
		}
		completeStream(t, holder)
	})

	t.Run("not ready", func(t *testing.T) {
		// Kubernetes mode against an API server that is not there: the
		// picker serves, never syncs, and answers 503 not_ready.
		kc := filepath.Join(t.TempDir(), "kubeconfig")
		if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "http://127.0.0.1:1"}}]
users: [{name: none, user: {}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
`), 0o600); err != nil {
			t.Fatal(err)
		}
		p := startEPP(t, launch.EPPOptions{SkipReady: true, Args: []string{flag, "--pool-name=pool", "--pool-namespace=default", "--kubeconfig=" + kc}})
		ex := mustStart(t, p.Client(t, extprocclient.Options{}), spec(tokens(8, 1)))
		if got := retryAfter(t, ex, http.StatusServiceUnavailable, "not_ready"); got != dflt {
			t.Errorf("retry-after %d, want the flag's %d", got, dflt)
		}
	})
}
