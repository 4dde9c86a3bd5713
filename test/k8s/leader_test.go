package k8s

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/laneway-dev/laneway/internal/epp"
	"github.com/laneway-dev/laneway/internal/ha"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

// Leader-election timing of the failover test: shorter than the defaults
// so the test is quick, in the same proportions.
const (
	leaseDuration = 3 * time.Second
	renewDeadline = 2 * time.Second
	retryPeriod   = 500 * time.Millisecond
)

// TestLeaderFailover: two replicas with leader election, both ready and
// serving. SIGKILL of the leader (no Lease release): the follower holds
// the Lease within the lease duration plus the election's retry
// granularity, and schedules. SIGTERM of that leader hands the Lease to
// the next replica within about one retry period: it is released at once.
func TestLeaderFailover(t *testing.T) {
	e := newEnv(t, false)
	e.createPool("pool", "llm")
	a := e.addPod("a", podSpec{app: "llm", ready: true})
	r1 := e.startEPP("epp-1", "pool", electionFlags()...)
	r1.waitReady() // the first replica up takes the Lease
	r2 := e.startEPP("epp-2", "pool", electionFlags()...)
	r2.waitReady() // a synced follower is ready too
	leader, follower := r1, r2
	if h := e.leaseHolder(); h != leader.identity() {
		t.Fatalf("Lease %s held by %q, want the first replica %q", ha.LeaseName("pool"), h, leader.identity())
	}
	t.Logf("lease %s held by %s", ha.LeaseName("pool"), leader.identity())
	follower.waitEndpoints(time.Now(), followLimit, a.addr(e.port))
	serve(t, follower.start(ctx(t), request("")))
	serve(t, leader.start(ctx(t), request("")))

	t0 := time.Now()
	leader.Kill()
	e.waitLease("held by the follower", func(l *coordinationv1.Lease) bool {
		return ptr.Deref(l.Spec.HolderIdentity, "") == follower.identity()
	})
	failover := time.Since(t0)
	// client-go renews every RetryPeriod and a candidate retries every
	// RetryPeriod with up to 1.2× jitter: the follower sees the last renewal
	// up to one jittered retry late, the Lease expires LeaseDuration after
	// that, and is taken at the next retry (≤ LeaseDuration + 2.4 retries).
	// The extra second is scheduling slack on a loaded 2-core machine.
	bound := leaseDuration + 3*retryPeriod + time.Second
	t.Logf("leader SIGKILLed: the follower holds the Lease %v later (lease %v, retry %v, bound %v)",
		failover.Round(time.Millisecond), leaseDuration, retryPeriod, bound)
	if failover > bound {
		t.Errorf("failover took %v, want within %v", failover, bound)
	}
	follower.Metrics.Await(t, 1, "laneway_ha_leader")
	serve(t, follower.start(ctx(t), request("")))

	// A leader stopped with SIGTERM releases the Lease at once: the next
	// replica takes over at its next retry, not after a lease.
	r3 := e.startEPP("epp-3", "pool", electionFlags()...)
	r3.waitReady()
	t0 = time.Now()
	if err := follower.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	e.waitLease("held by the next replica", func(l *coordinationv1.Lease) bool {
		return ptr.Deref(l.Spec.HolderIdentity, "") == r3.identity()
	})
	handover := time.Since(t0)
	t.Logf("leader SIGTERMed: the next replica holds the Lease %v later (retry %v)", handover.Round(time.Millisecond), retryPeriod)
	if handover >= leaseDuration {
		t.Errorf("handover after SIGTERM took %v: the Lease was not released (lease %v)", handover, leaseDuration)
	}
	if err := follower.Wait(stopGrace); err != nil {
		t.Fatalf("leader shutdown: %v", err)
	}
	serve(t, r3.start(ctx(t), request("")))
}

// TestDeposedLeaderFollows: a leader that can no longer renew its Lease
// (here another holder took it) steps down within the renew deadline but
// neither exits nor stops serving: a stream dispatched before plays to its
// end, and new streams are scheduled here, since the new holder names no
// address to forward to.
func TestDeposedLeaderFollows(t *testing.T) {
	e := newEnv(t, false)
	e.createPool("pool", "llm")
	a := e.addPod("a", podSpec{app: "llm", ready: true})
	p := e.startEPP("epp", "pool", electionFlags()...)
	p.waitReady()
	p.waitEndpoints(time.Now(), followLimit, a.addr(e.port))
	p.Metrics.Await(t, 1, "laneway_ha_leader")
	held := p.start(ctx(t), request(""))
	routed(t, held)

	e.usurpLease("intruder")
	t0 := time.Now()
	bound := renewDeadline + 3*retryPeriod + time.Second
	launch.WaitWithin(t, bound, func() string { return "the deposed leader still reports laneway_ha_leader 1" },
		func() bool { return p.Metrics.Value(t, "laneway_ha_leader") == 0 })
	t.Logf("deposed leader stepped down %v after the Lease was taken (renew deadline %v)", time.Since(t0).Round(time.Millisecond), renewDeadline)
	p.WaitLog(t, "leader election lost")
	if err := p.Exited(); err != nil {
		t.Fatalf("deposed leader: %v", err)
	}
	if st := health(t, p); st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("deposed leader readiness %v, want SERVING", st)
	}
	serve(t, held)
	before := p.Metrics.Value(t, "laneway_ha_streams_total", "route", "local")
	serve(t, p.start(ctx(t), request("")))
	if after := p.Metrics.Value(t, "laneway_ha_streams_total", "route", "local"); after != before+1 {
		t.Errorf("local streams %v -> %v, want +1: the stream was not scheduled here", before, after)
	}
}

// leaseHolder is the current holder of the pool's election Lease.
func (e *env) leaseHolder() string {
	e.t.Helper()
	var l coordinationv1.Lease
	if err := admin.Get(ctx(e.t), client.ObjectKey{Namespace: e.ns, Name: ha.LeaseName("pool")}, &l); err != nil {
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
		t.Errorf("the forbidden error does not name the ServiceAccount laneway-epp: %s", l)
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

// TestReleaseAfterConflict: the shutdown's release of the Lease meets a
// conflicting write (a renewal the shutdown cancelled can still land on
// the API server between the release's read and its write). The Lease is
// released all the same, so the next leader does not wait out the lease
// duration. Found by TestRollingUpdate under load: "Failed to release
// lease ... the object has been modified", then a 3.97 s handover against
// a 3 s lease. The elector runs in this process, against the real API
// server, with one competing write injected before the release's write.
func TestReleaseAfterConflict(t *testing.T) {
	e := newEnv(t, false)
	const identity = "me_127.0.0.1:1_ab"
	var armed, injected atomic.Bool
	cfg := rest.CopyConfig(adminCfg)
	cfg.ContentType = "application/json" // the round trip below reads the record
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method == http.MethodPut && armed.Load() && req.Body != nil {
				body, err := io.ReadAll(req.Body)
				if err != nil {
					return nil, err
				}
				req.Body = io.NopCloser(bytes.NewReader(body))
				var l coordinationv1.Lease
				if err := json.Unmarshal(body, &l); err != nil {
					return nil, err
				}
				if ptr.Deref(l.Spec.HolderIdentity, "") == "" && injected.CompareAndSwap(false, true) {
					e.bumpLease() // the late renewal
				}
			}
			return rt.RoundTrip(req)
		})
	}
	// Long enough that a Lease left held is plainly seen held.
	const lease, renew, retry = 15 * time.Second, 10 * time.Second, time.Second
	lock, err := ha.LeaseLock(cfg, e.ns, "pool", identity, renew)
	if err != nil {
		t.Fatal(err)
	}
	synced, stopping := make(chan struct{}), make(chan struct{})
	close(synced)
	el, err := ha.NewElector(ha.ElectorConfig{Lock: lock, Identity: identity,
		LeaseDuration: lease, RenewDeadline: renew, RetryPeriod: retry,
		Synced: synced, Stopping: stopping, Registry: prometheus.NewRegistry(), Log: testr.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- el.Run(runCtx) }()
	defer func() { stop(); <-done }()
	e.waitLease("held by the elector", func(l *coordinationv1.Lease) bool {
		return ptr.Deref(l.Spec.HolderIdentity, "") == identity
	})

	armed.Store(true)
	t0 := time.Now()
	close(stopping)
	released := e.waitLeaseFor(lease/3, "released", func(l *coordinationv1.Lease) bool {
		return ptr.Deref(l.Spec.HolderIdentity, "") == ""
	})
	if !injected.Load() {
		t.Fatal("no release was written: the conflict was never injected")
	}
	t.Logf("Lease released %v after the stop despite a conflicting write (transitions %d)",
		time.Since(t0).Round(time.Millisecond), ptr.Deref(released.Spec.LeaseTransitions, 0))
}

// roundTripFunc is an http.RoundTripper of one function.
type roundTripFunc func(*http.Request) (*http.Response, error)

// RoundTrip implements http.RoundTripper.
func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// bumpLease changes the pool's Lease without touching its record, as any
// writer of it would: its resourceVersion moves on.
func (e *env) bumpLease() {
	e.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var l coordinationv1.Lease
		if err := admin.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: ha.LeaseName("pool")}, &l); err != nil {
			return err
		}
		metav1.SetMetaDataAnnotation(&l.ObjectMeta, "test.laneway.dev/bumped", time.Now().Format(time.RFC3339Nano))
		return admin.Update(context.Background(), &l)
	})
	if err != nil {
		e.t.Errorf("bump the Lease: %v", err)
	}
}
