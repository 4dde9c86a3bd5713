package k8s

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/internal/testbed/workload"
)

// simArgs are the model server's flags: the SPEC §11 server (4 sequences,
// 8192-token steps, no prefix caching), as internal/testbed/demo runs it.
var simArgs = []string{
	"--max-num-seqs=4", "--max-num-batched-tokens=8192", "--enable-prefix-caching=false",
	"--prefill-tokens-per-sec=40000", "--time-per-output-token=10ms",
}

// TestThreeReplicasWeightedShare is SPEC §11's weighted-share workload
// (320 premium and 320 regular 512-token prompts released together,
// quanta 512:128) through three replicas behind the local gateway, which
// spreads the streams over them: the followers send their requests'
// tickets to the leader, whose one queue gives the single picker's bands,
// every request answered once. Then again with the leader SIGKILLed in
// the middle of the run: every request is still answered once; the test
// reports how many tickets the followers offered again after the kill,
// and how long they waited. The processes serve both runs.
func TestThreeReplicasWeightedShare(t *testing.T) {
	e := newEnv(t, false)
	e.createPool("pool", "sim")
	ip := newIP()
	sim := bins.RunSim(t, launch.SimOptions{Host: ip, Port: e.port, Args: append([]string{"--instance=sim", "--model=sim-model"}, simArgs...),
		Proc: launch.ProcOptions{Name: "modelsim"}})
	e.addPod("sim", podSpec{app: "sim", ready: true, ip: ip})
	for _, c := range []struct {
		name    string
		quantum int64
	}{{"premium", 512}, {"regular", 128}} {
		pc := policyClass(c.name, "pool", c.quantum, ptr.To[int64](1536))
		pc.Spec.RequestQueueLimitPerWorker = ptr.To[int64](1024)
		e.create(pc)
	}
	var rs []*eppProc
	for i := range 3 {
		p := e.startEPP(fmt.Sprintf("epp-%d", i+1), "pool", electionFlags()...)
		p.waitReady()
		rs = append(rs, p)
	}
	for _, name := range []string{"premium", "regular"} {
		e.waitClass(name, "accepted", accepted("True", "Accepted"))
	}
	var leader *eppProc
	for _, p := range rs {
		p.waitEndpoints(time.Now(), followLimit, sim.Addr)
		if p.identity() == e.leaseHolder() {
			leader = p
		}
	}
	if leader == nil {
		t.Fatalf("no replica holds the Lease (%q)", e.leaseHolder())
	}
	for _, p := range rs {
		if p != leader {
			awaitWorkloadForwarding(t, p)
		}
	}
	epps := make([]*launch.EPP, len(rs))
	for i, p := range rs {
		epps[i] = p.EPP
	}
	gw := bins.RunGateway(t, launch.GatewayOptions{EPPs: epps, Timeout: 3 * time.Minute, Proc: launch.ProcOptions{Name: "gateway"}})

	run := func(seed int, progress func(done, total int)) *workload.Result {
		t.Helper()
		c, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		res, err := workload.Run(c, workload.Spec{
			URL: gw.URL + "/v1/completions", Model: "sim-model", Classes: []string{"premium", "regular"},
			PerClass: 320, PromptTokens: 512, Seed: seed, Progress: progress,
		})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	answeredOnce := func(name string, res *workload.Result) {
		t.Helper()
		if len(res.Completions) != 640 {
			t.Errorf("%s: %d answers for 640 requests", name, len(res.Completions))
		}
		for _, c := range res.Completions {
			if c.Err != nil || c.Status != 200 {
				t.Errorf("%s: a %s request was answered %d: %v", name, c.Class, c.Status, c.Err)
				break
			}
		}
	}

	// Three replicas, one queue: the single picker's bands.
	res := run(1, nil)
	s := workload.Analyze(res)
	t.Logf("three replicas, quanta 512:128 (%.1fs): %s", res.Elapsed.Seconds(), s)
	for _, m := range s.Check(true) {
		t.Errorf("three replicas: %s", m)
	}
	answeredOnce("three replicas", res)
	for _, p := range rs {
		logRoutes(t, p)
	}

	// The leader SIGKILLed after 100 completions.
	var killedAt atomic.Int64
	res = run(2, func(done, _ int) {
		if done == 100 && killedAt.CompareAndSwap(0, time.Now().UnixNano()) {
			leader.Kill()
		}
	})
	killed := time.Unix(0, killedAt.Load())
	answeredOnce("leader killed", res)
	s = workload.Analyze(res)
	t.Logf("leader killed after 100 completions (%.1fs): %s", res.Elapsed.Seconds(), s)
	var next *eppProc
	for _, p := range rs {
		if p != leader && p.Metrics.Value(t, "laneway_ha_leader") == 1 {
			next = p
		}
	}
	var fallback, reoffered, waitSum, waitCount float64
	for _, p := range rs {
		if p == leader {
			continue
		}
		m := p.Metrics.Read(t)
		fallback += m.Value("laneway_ha_streams_total", "route", "fallback")
		reoffered += m.Value("laneway_ha_streams_total", "route", "reoffered")
		waitSum += m.Value("laneway_ha_reoffered_wait_seconds_sum")
		waitCount += m.Value("laneway_ha_reoffered_wait_seconds_count")
		logRoutes(t, p)
	}
	retried := strings.Count(gw.Log.String(), "failed before deciding")
	unpicked := strings.Count(gw.Log.String(), "failed after deciding")
	t.Logf("after the kill: %v tickets waiting at the killed leader were offered again (%v decided by their own replica, %v by the next leader), "+
		"on average %.0f ms after their first offer; the gateway asked another replica for %d requests the killed one had not decided, "+
		"and finished %d responses without it; next leader: %v",
		fallback+reoffered, fallback, reoffered, 1000*waitSum/max(waitCount, 1), retried, unpicked, name(next))
	if next == nil {
		t.Errorf("no surviving replica leads after the kill at %v", killed.Format(time.StampMilli))
	}
}

func name(p *eppProc) string {
	if p == nil {
		return "none"
	}
	return p.Name
}

// awaitWorkloadForwarding plays requests through a follower until one
// was sent to the leader as a ticket (its link is up).
func awaitWorkloadForwarding(t *testing.T, p *eppProc) {
	t.Helper()
	before := p.Metrics.Value(t, "laneway_ha_streams_total", "route", "forwarded")
	launch.WaitFor(t, func() string { return p.Name + " never sent the leader a ticket" }, func() bool {
		ex := p.start(ctx(t), request(""))
		_ = ex.Close()
		return p.Metrics.Value(t, "laneway_ha_streams_total", "route", "forwarded") > before
	})
}
