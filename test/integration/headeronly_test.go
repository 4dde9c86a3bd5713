package integration

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/internal/testbed/workload"
)

// specEngine is the SPEC §11 model server as the demo and the e2e suites
// run it: 4 sequences, 8192-token steps, no prefix caching.
var specEngine = []string{
	"--max-num-seqs=4", "--max-num-batched-tokens=8192", "--enable-prefix-caching=false",
	"--prefill-tokens-per-sec=40000", "--time-per-output-token=10ms",
}

// maxEngineWaiting bounds the engine's waiting queue during a run: twice
// its max_num_seqs. A picker that holds its queue itself keeps the
// engine's short; one that has lost count of what it sent floods it, and
// the engine's FCFS order then decides the shares instead of the policy.
const maxEngineWaiting = 2 * 4

// TestWeightedShareHeaderOnly runs SPEC §11's weighted-share workload
// through the real local gateway to a real model-server simulator, with
// the gateway playing each ext_proc client the picker must serve fairly:
// Envoy with every phase (the reference: it must pass), NGINX Gateway
// Fabric's endpoint-picker shim (header-only, a connection per request)
// and Envoy with the response phases skipped (header-only, one
// connection). Header-only gateways tell the picker nothing after its
// answer: its accounting must not wait for response events (issue 21).
// Each run must put premium >= 240 and regular >= 48 in the first 320
// completions at quanta 512:128 (premium in [140, 180] at the 512:512
// control), answer all 640 requests exactly once, and keep the engine's
// waiting queue at or under twice its sequences.
//
// One simulator and one picker serve every run (the control after a
// policy reload), so the runs cost the workload and little else.
func TestWeightedShareHeaderOnly(t *testing.T) {
	launch.CheckGoroutines(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()

	sim := bins.RunSim(t, launch.SimOptions{Args: specEngine})
	policy := writePolicy(t, workload.PolicyYAML(512, 128))
	p := bins.RunEPP(t, launch.EPPOptions{
		Endpoints: []string{sim.Addr},
		Policy:    policy,
		TLS:       true,
		Args: []string{"--max-num-batched-tokens=8192", "--policy-poll-interval=100ms",
			"--drain-timeout=" + drainTimeout.String()},
		Proc: launch.ProcOptions{StopGrace: drainTimeout + 5*time.Second},
	})
	gateways := map[string]*launch.Gateway{
		"response-phases": bins.RunGateway(t, launch.GatewayOptions{EPP: p, Timeout: 3 * time.Minute,
			Proc: launch.ProcOptions{Name: "gateway response-phases"}}),
		"nginx-shim": bins.RunGateway(t, launch.GatewayOptions{EPP: p, Timeout: 3 * time.Minute, HeaderOnly: true, ConnPerRequest: true,
			Proc: launch.ProcOptions{Name: "gateway nginx-shim"}}),
		"envoy-skip": bins.RunGateway(t, launch.GatewayOptions{EPP: p, Timeout: 3 * time.Minute, HeaderOnly: true,
			Proc: launch.ProcOptions{Name: "gateway envoy-skip"}}),
	}
	transport := &http.Transport{MaxIdleConnsPerHost: 1024}
	t.Cleanup(transport.CloseIdleConnections)
	client := &http.Client{Transport: transport}

	seed := 0
	run := func(t *testing.T, gateway string, weighted bool) {
		seed++
		dispatched0 := p.Metrics.Value(t, "laneway_dispatches_total")
		s, waiting := runWatched(ctx, t, sim, gateway, workload.Spec{
			URL: gateways[gateway].URL + "/v1/completions", Model: "sim-model",
			Classes: []string{"premium", "regular"}, PerClass: perClass, PromptTokens: promptLen,
			Client: client, Seed: 100 + seed,
		})
		if n := p.Metrics.Value(t, "laneway_dispatches_total") - dispatched0; n != 2*perClass {
			t.Errorf("the picker dispatched %v requests, want %d", n, 2*perClass)
		}
		if weighted {
			if s.FirstInPrefix < 240 || s.SecondInPrefix < 48 {
				t.Errorf("first %d: premium %d (want >= 240), regular %d (want >= 48)", s.Prefix, s.FirstInPrefix, s.SecondInPrefix)
			}
		} else if s.FirstInPrefix < 140 || s.FirstInPrefix > 180 {
			t.Errorf("first %d: premium %d, want within [140, 180]", s.Prefix, s.FirstInPrefix)
		}
		if waiting > maxEngineWaiting {
			t.Errorf("engine waiting queue reached %v, want <= %d (2 x max_num_seqs)", waiting, maxEngineWaiting)
		}
	}

	for _, gw := range []string{"response-phases", "nginx-shim", "envoy-skip"} {
		t.Run(gw+"/512:128", func(t *testing.T) { run(t, gw, true) })
	}
	replaceFile(t, policy, workload.PolicyYAML(512, 512))
	p.WaitLog(t, "policy reloaded")
	t.Run("nginx-shim/512:512", func(t *testing.T) { run(t, "nginx-shim", false) })
}

// TestHeaderOnlyClients drives the real picker with the two header-only
// clients: the picker reads the class header from value (the shim never
// fills raw_value) as well as raw_value, answers, and ends each stream
// once the client has half-closed it, so that the client, which reads
// until the picker ends the stream, returns.
func TestHeaderOnlyClients(t *testing.T) {
	launch.CheckGoroutines(t)
	bs := startBackends(t, 1)
	p := startEPP(t, launch.EPPOptions{Endpoints: addrs(bs), Policy: writePolicy(t, workload.PolicyYAML(512, 128)), TLS: true})
	clients := map[string]*extprocclient.Client{
		"nginx-shim": extprocclient.NewPerRequest(p.Dial, extprocclient.Options{Shape: extprocclient.NginxShim}),
		"envoy-skip": p.Client(t, extprocclient.Options{Shape: extprocclient.EnvoySkip}),
	}
	i := 0
	for name, c := range clients {
		for range 2 {
			i++
			ex, err := c.Start(testCtx(t), spec(tokens(100, i), "x-dynamo-meta-policy-class", "premium"))
			if err != nil {
				t.Fatalf("%s: Start (returns once the picker ends the stream): %v", name, err)
			}
			if got := mustRoute(t, ex); got != bs[0].addr || !ex.Ended() {
				t.Errorf("%s: routed to %s, stream ended %t; want %s, ended", name, got, ex.Ended(), bs[0].addr)
			}
			if err := ex.Close(); err != nil {
				t.Errorf("%s: Close: %v", name, err)
			}
		}
	}
	if n := p.Metrics.Value(t, "laneway_dispatches_total", "policy_class", "premium"); n != float64(i) {
		t.Errorf("%v requests dispatched as premium, want %d: the class header was not read", n, i)
	}
}

// TestTwoPickersOneEngine puts two standalone pickers, each behind its own
// gateway, in front of the same model server and gives each half of SPEC
// §11's weighted-share workload (every other round of the interleaving,
// so each sees both classes). Neither picker knows the other: each sees
// the other's requests only through the engine (its waiting queue, its
// prompt-token counter). Both runs, with response phases and header-only
// (NGINX's shim), must keep the engine's waiting queue at or under twice
// its sequences and give the combined first 320 completions the
// single-picker band (premium >= 240, regular >= 48 at 512:128), each
// picker dispatching exactly its half and every request answered once.
//
// Behind header-only gateways each picker keeps a grant charged until
// the engine's counts show it arrived, taking only its share of the
// engine's arrivals for its own, and drains the engine's queue between
// scrapes at its share of the engine's rate (the other picker refills
// its part). The shares must add up to no more than the engine's
// arrivals: a picker that takes another's arrivals for its own grants,
// still on their way through a gateway slow at the start of a run, sends
// on, and both bursts land in the engine's queue together; so do the
// grants each releases by prediction while its earlier ones are held up
// in a gateway (the ledger's stalled). The response-phases run comes
// first, as a deployment's traffic does before its gateways change: the
// header-only run starts with the shares the pickers measured in it.
// Started cold instead (-run TestTwoPickersOneEngine/nginx-shim), a
// burst of 640 through gateways that open a TLS connection per request
// meets two pickers that have measured nothing: see the ledger's
// coldShare and aloneStillScrapes for what that measured.
func TestTwoPickersOneEngine(t *testing.T) {
	launch.CheckGoroutines(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	sim := bins.RunSim(t, launch.SimOptions{Args: specEngine})
	policy := writePolicy(t, workload.PolicyYAML(512, 128))
	var pickers [2]*launch.EPP
	for i := range pickers {
		pickers[i] = bins.RunEPP(t, launch.EPPOptions{
			Endpoints: []string{sim.Addr},
			Policy:    policy,
			TLS:       true,
			Args:      []string{"--max-num-batched-tokens=8192"},
			Proc:      launch.ProcOptions{Name: fmt.Sprintf("picker %d", i)},
		})
	}
	transport := &http.Transport{MaxIdleConnsPerHost: 1024}
	t.Cleanup(transport.CloseIdleConnections)
	client := &http.Client{Transport: transport}

	for seed, headerOnly := range []bool{false, true} {
		name := map[bool]string{false: "response-phases", true: "nginx-shim"}[headerOnly]
		t.Run(name, func(t *testing.T) {
			var urls []string
			var dispatched0 [2]float64
			for i, p := range pickers {
				gw := bins.RunGateway(t, launch.GatewayOptions{EPP: p, Timeout: 3 * time.Minute,
					HeaderOnly: headerOnly, ConnPerRequest: headerOnly,
					Proc: launch.ProcOptions{Name: fmt.Sprintf("gateway %d %s", i, name)}})
				urls = append(urls, gw.URL+"/v1/completions")
				dispatched0[i] = p.Metrics.Value(t, "laneway_dispatches_total")
			}
			s, waiting := runWatched(ctx, t, sim, "two pickers, "+name, workload.Spec{
				URLs: urls, Model: "sim-model",
				Classes: []string{"premium", "regular"}, PerClass: perClass, PromptTokens: promptLen,
				Client: client, Seed: 200 + seed,
			})
			for i, p := range pickers {
				if n := p.Metrics.Value(t, "laneway_dispatches_total") - dispatched0[i]; n != perClass {
					t.Errorf("picker %d dispatched %v requests, want its half, %d", i, n, perClass)
				}
			}
			if s.FirstInPrefix < 240 || s.SecondInPrefix < 48 {
				t.Errorf("first %d: premium %d (want >= 240), regular %d (want >= 48)", s.Prefix, s.FirstInPrefix, s.SecondInPrefix)
			}
			if waiting > maxEngineWaiting {
				t.Errorf("engine waiting queue reached %v, want <= %d", waiting, maxEngineWaiting)
			}
		})
	}
}

// runWatched runs spec against the simulator's gateways while sampling the
// engine's waiting queue every 20 ms, logs the shares under label, and
// checks that every request was answered 200 exactly once, both as the
// client saw it and as the engine counted it. It returns the shares and
// the most requests the engine had waiting.
func runWatched(ctx context.Context, t *testing.T, sim *launch.Sim, label string, spec workload.Spec) (workload.Shares, float64) {
	t.Helper()
	served0 := sim.Metrics.Value(t, "vllm:request_success_total")
	watch := sim.Metrics.WatchMax(20*time.Millisecond, "vllm:num_requests_waiting")
	res, err := workload.Run(ctx, spec)
	waiting, samples, werr := watch.Stop()
	if err != nil {
		t.Fatalf("workload: %v", err)
	}
	s := workload.Analyze(res)
	t.Logf("%s (%.1fs): %s; engine waiting max %v over %d samples", label, res.Elapsed.Seconds(), s, waiting, samples)
	if werr != nil {
		t.Errorf("engine waiting queue not sampled throughout: %v", werr)
	}
	total := len(spec.Classes) * spec.PerClass
	if len(res.Completions) != total || s.OK != total {
		t.Errorf("%d completions, %d answered 200; want %d of each", len(res.Completions), s.OK, total)
		for _, c := range res.Completions {
			if c.Err != nil {
				t.Errorf("first failure: %s: %v", c.Class, c.Err)
				break
			}
		}
	}
	if n := sim.Metrics.Value(t, "vllm:request_success_total") - served0; n != float64(total) {
		t.Errorf("the engine served %v requests, want %d", n, total)
	}
	return s, waiting
}
