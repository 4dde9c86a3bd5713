package integration

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

// faultHeader is the request header a picker built with the lanewayfaults
// tag panics on, at the point it names. A production build has no such
// header: the files that read it are compiled only with the tag.
const faultHeader = "x-laneway-test-fault"

// buildFaultPicker builds cmd/epp with the lanewayfaults tag into the
// test's temp dir. The go command reads the tag from GOFLAGS, which the
// build inherits.
func buildFaultPicker(t *testing.T) launch.Binaries {
	t.Helper()
	t.Setenv("GOFLAGS", "-tags=lanewayfaults")
	bin, err := launch.BuildPackage(t.TempDir(), "./cmd/epp", launch.RaceFromEnv())
	if err != nil {
		t.Fatal(err)
	}
	return launch.Binaries{Epp: bin}
}

// TestPanicContained: a panic while handling one stream, in the handler
// (before and after it was granted an endpoint) or in the stream state
// machine, answers that stream 500 with a JSON error (or, once the pick
// was sent, ends the stream with a gRPC error), logs the stack once, gives
// back the grant, and leaves the process and every other stream running.
// The production build ignores the fault header.
func TestPanicContained(t *testing.T) {
	launch.CheckGoroutines(t)
	bs := startBackends(t, 1)
	ep := bs[0].addr

	t.Run("production build ignores the header", func(t *testing.T) {
		p := startEPP(t, launch.EPPOptions{Endpoints: []string{ep}})
		c := p.Client(t, extprocclient.Options{})
		for _, point := range []string{"decide", "after_grant", "request_body"} {
			ex := mustStart(t, c, spec(tokens(16, 1), faultHeader, point))
			mustRoute(t, ex)
			completeStream(t, ex)
		}
	})

	p := startEPPOf(t, buildFaultPicker(t), launch.EPPOptions{Endpoints: []string{ep}})
	c := p.Client(t, extprocclient.Options{})
	// A stream in flight through every fault, finished at the end.
	bystander := mustStart(t, c, spec(tokens(16, 0)))
	mustRoute(t, bystander)
	sendFirstByte(t, bystander)

	for i, point := range []string{"decide", "after_grant", "request_body"} {
		ex := mustStart(t, c, spec(tokens(16, i+1), faultHeader, point))
		ir := immediate(t, ex, http.StatusInternalServerError, "internal_error")
		var body struct{ Error string }
		if err := json.Unmarshal(ir.Body, &body); err != nil || body.Error == "" {
			t.Errorf("%s: 500 body %q, want a JSON error", point, ir.Body)
		}
	}
	// After the pick went out there is no answer left to give: the stream
	// ends with an error the gateway turns into its own failure.
	late := mustStart(t, c, spec(tokens(16, 9), faultHeader, "response_headers"))
	mustRoute(t, late)
	if _, err := late.SendResponseHeaders(http.StatusOK, nil, false, ""); err == nil {
		t.Error("response headers after a panic: no error, want the stream ended")
	}

	if err := p.Exited(); err != nil {
		t.Fatalf("the picker died: %v", err)
	}
	// The grant of the request that panicked after it was granted, and the
	// late one's, were given back: only the bystander is in flight.
	p.Metrics.Await(t, 1, "laneway_endpoint_in_flight_requests", "endpoint", ep)
	finishStream(t, bystander)
	ex := mustStart(t, c, spec(tokens(16, 10)))
	mustRoute(t, ex)
	completeStream(t, ex)
	p.Metrics.Await(t, 0, "laneway_endpoint_in_flight_requests", "endpoint", ep)
	p.Metrics.Await(t, 4, "laneway_extproc_streams_total", "outcome", "panic")

	// One log line per panic, each with its stack.
	var panics []string
	for line := range strings.SplitSeq(p.Log.String(), "\n") {
		if strings.Contains(line, "stream handler panicked") {
			panics = append(panics, line)
		}
	}
	if len(panics) != 4 {
		t.Fatalf("%d panic log lines, want 4:\n%s", len(panics), strings.Join(panics, "\n"))
	}
	for _, l := range panics {
		var f struct{ Level, Error, Stack string }
		if err := json.Unmarshal([]byte(l), &f); err != nil || f.Level != "error" ||
			!strings.Contains(f.Error, "injected fault") || !strings.Contains(f.Stack, "goroutine ") {
			t.Errorf("panic line %s: want level error, the panic value and a stack", l)
		}
	}
}
