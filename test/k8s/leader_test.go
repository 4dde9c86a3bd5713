package k8s

import (
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/laneway-dev/laneway/internal/epp"
	"github.com/laneway-dev/laneway/internal/launch"
)

// Leader-election timing of the failover test: shorter than the defaults
// so the test is quick, in the same proportions.
const (
	leaseDuration = 3 * time.Second
	renewDeadline = 2 * time.Second
	retryPeriod   = 500 * time.Millisecond
)

// TestLeaderFailover: two replicas with leader election. Only the leader is
// ready and schedules; the follower answers 503 not_leader. SIGKILL of the
// leader (no Lease release) makes the follower ready and scheduling within
// the lease duration plus the election's retry granularity.
func TestLeaderFailover(t *testing.T) {
	e := newEnv(t, false)
	e.createPool("pool", "llm")
	a := e.addPod("a", podSpec{app: "llm", ready: true})
	le := []string{
		"--ha-enable-leader-election",
		"--leader-election-lease-duration=" + leaseDuration.String(),
		"--leader-election-renew-deadline=" + renewDeadline.String(),
		"--leader-election-retry-period=" + retryPeriod.String(),
	}
	r1 := e.startEPP("epp-1", "pool", le...)
	r1.waitReady() // the first replica up takes the Lease
	r2 := e.startEPP("epp-2", "pool", le...)
	w2 := r2.watchReadiness()
	r2.WaitLog(t, "waiting to be elected leader") // synced follower

	leader, follower, wf := r1, r2, w2
	holder := e.leaseHolder()
	t.Logf("lease %s held by %s", epp.LeaseName("pool"), holder)

	// The follower: not ready, answers 503 not_leader, but its caches and
	// dispatcher are warm.
	if st := health(t, follower); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("follower readiness %v, want NOT_SERVING", st)
	}
	ex := follower.start(ctx(t), request(""))
	if d := ex.Decision(); d.Routed() || d.Immediate.Status != 503 || d.Immediate.Headers.Get("x-laneway-reason") != epp.ReasonNotLeader {
		t.Fatalf("follower answered %+v, want 503 %s", d, epp.ReasonNotLeader)
	}
	_ = ex.Close()
	follower.waitEndpoints(time.Now(), followLimit, a.addr(e.port))
	serve(t, leader.start(ctx(t), request("")))

	t0 := time.Now()
	leader.Kill()
	ready := follower.waitStatus(wf, healthpb.HealthCheckResponse_SERVING, launch.DefaultReadyTimeout)
	failover := ready.Sub(t0)
	// client-go renews every RetryPeriod and a candidate retries every
	// RetryPeriod with up to 1.2× jitter: the follower sees the last renewal
	// up to one jittered retry late, the Lease expires LeaseDuration after
	// that, and is taken at the next retry (≤ LeaseDuration + 2.4 retries).
	// The extra second is scheduling slack on a loaded 2-core machine.
	bound := leaseDuration + 3*retryPeriod + time.Second
	t.Logf("leader SIGKILLed: follower ready after %v (lease %v, retry %v, bound %v)",
		failover.Round(time.Millisecond), leaseDuration, retryPeriod, bound)
	if failover > bound {
		t.Errorf("failover took %v, want within %v", failover, bound)
	}
	if h := e.leaseHolder(); h == holder {
		t.Errorf("lease still held by the killed leader %s", h)
	}
	serve(t, follower.start(ctx(t), request("")))

	// A leader stopped with SIGTERM releases the Lease as it drains: the
	// next replica takes over at its next retry, not after a lease.
	r3 := e.startEPP("epp-3", "pool", le...)
	w3 := r3.watchReadiness()
	r3.WaitLog(t, "waiting to be elected leader")
	t0 = time.Now()
	if err := follower.Stop(stopGrace); err != nil {
		t.Fatalf("leader shutdown: %v", err)
	}
	handover := r3.waitStatus(w3, healthpb.HealthCheckResponse_SERVING, launch.DefaultReadyTimeout).Sub(t0)
	t.Logf("leader SIGTERMed: next replica ready after %v (drain and release, then its next retry)", handover.Round(time.Millisecond))
	if handover >= leaseDuration {
		t.Errorf("handover after SIGTERM took %v: the Lease was not released (lease %v)", handover, leaseDuration)
	}
	serve(t, r3.start(ctx(t), request("")))
}

// TestDeposedLeaderStopsServing: a leader that can no longer renew its
// Lease (here another holder took it) stops being ready within the renew
// deadline and exits, to come back as a follower.
func TestDeposedLeaderStopsServing(t *testing.T) {
	e := newEnv(t, false)
	e.createPool("pool", "llm")
	e.addPod("a", podSpec{app: "llm", ready: true})
	p := e.startEPP("epp", "pool",
		"--ha-enable-leader-election",
		"--leader-election-lease-duration="+leaseDuration.String(),
		"--leader-election-renew-deadline="+renewDeadline.String(),
		"--leader-election-retry-period="+retryPeriod.String())
	w := p.watchReadiness()
	p.waitStatus(w, healthpb.HealthCheckResponse_SERVING, launch.DefaultReadyTimeout)
	p.ExpectFailure()

	e.usurpLease("intruder")
	t0 := time.Now()
	// Not serving: NOT_SERVING, or the health stream ending with the
	// process, whichever the watch sees first.
	var lost time.Duration
	for lost == 0 {
		select {
		case st, ok := <-w:
			if !ok || st != healthpb.HealthCheckResponse_SERVING {
				lost = time.Since(t0)
			}
		case <-time.After(launch.EventTimeout):
			t.Fatalf("deposed leader still serving after %v", launch.EventTimeout)
		}
	}
	t.Logf("deposed leader not ready after %v (renew deadline %v)", lost.Round(time.Millisecond), renewDeadline)
	select {
	case <-p.Done():
	case <-time.After(launch.EventTimeout):
		t.Fatalf("deposed leader still running after %v", launch.EventTimeout)
	}
	if st := p.Cmd.ProcessState; st.Success() {
		t.Errorf("deposed leader exited %v, want a failure status so it restarts", st)
	}
	if !strings.Contains(p.Log.String(), "leader election lost") {
		t.Errorf("deposed leader did not log the lost election")
	}
}

// leaseHolder is the current holder of the pool's election Lease.
func (e *env) leaseHolder() string {
	e.t.Helper()
	var l coordinationv1.Lease
	if err := admin.Get(ctx(e.t), client.ObjectKey{Namespace: e.ns, Name: epp.LeaseName("pool")}, &l); err != nil {
		e.t.Fatalf("get Lease: %v", err)
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
		e.t.Fatal("Lease has no holder")
	}
	return *l.Spec.HolderIdentity
}

// health asks for the readiness status once.
func health(t *testing.T, p *eppProc) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	r, err := healthpb.NewHealthClient(p.healthConn).Check(ctx(t), &healthpb.HealthCheckRequest{Service: "readiness"})
	if err != nil {
		t.Fatalf("%s: readiness check: %v", p.Name, err)
	}
	return r.GetStatus()
}

// TestNotReadyUntilSynced: a picker whose ServiceAccount lacks the Role
// cannot sync its caches, so it is not ready and answers 503 not_ready;
// binding the committed Role makes it ready.
func TestNotReadyUntilSynced(t *testing.T) {
	e := newEnv(t, true)
	e.createPool("pool", "llm")
	a := e.addPod("a", podSpec{app: "llm", ready: true})
	p := e.startEPP("epp", "pool")
	w := p.watchReadiness()
	if l := p.WaitLog(t, "forbidden"); !strings.Contains(l, "laneway-epp") {
		t.Logf("forbidden: %s", l)
	}
	if st := health(t, p); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("readiness %v without RBAC, want NOT_SERVING", st)
	}
	ex := p.start(ctx(t), request(""))
	if d := ex.Decision(); d.Routed() || d.Immediate.Status != 503 || d.Immediate.Headers.Get("x-laneway-reason") != epp.ReasonNotReady {
		t.Fatalf("unsynced picker answered %+v, want 503 %s", d, epp.ReasonNotReady)
	}
	_ = ex.Close()

	t0 := time.Now()
	e.applyRole()
	p.waitStatus(w, healthpb.HealthCheckResponse_SERVING, launch.DefaultReadyTimeout)
	t.Logf("ready %v after the Role was bound (client-go's list retry backoff)", time.Since(t0).Round(time.Millisecond))
	p.waitEndpoints(time.Now(), followLimit, a.addr(e.port))
	serve(t, p.start(ctx(t), request("")))
}
