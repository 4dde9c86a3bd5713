package k8s

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/laneway-dev/laneway/internal/epp"
	"github.com/laneway-dev/laneway/internal/ha"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

// TestSIGTERMDrainHandsOver: a leader SIGTERMed with one dispatched stream
// open and requests queued answers the queued ones 503 shutting_down,
// releases the Lease while the dispatched stream is still open (the
// follower holds it before that stream ends, not after the drain), lets
// the stream finish, and exits 0 within --drain-timeout.
func TestSIGTERMDrainHandsOver(t *testing.T) {
	const drainTimeout = 5 * time.Second
	e := newEnv(t, false)
	e.createPool("pool", "llm")
	a := e.addPod("a", podSpec{app: "llm", ready: true})
	// Threshold 0: the dispatched request's prefill makes the pod busy, so
	// the next ones queue.
	e.create(policyClass("lane", "pool", 100, ptr.To[int64](0)))
	args := append(electionFlags(), "--drain-timeout="+drainTimeout.String())
	leader := e.startEPP("epp-1", "pool", args...)
	leader.waitReady()
	e.waitClass("lane", "accepted", accepted("True", "Accepted"))
	leader.waitEndpoints(time.Now(), followLimit, a.addr(e.port))
	follower := e.startEPP("epp-2", "pool", args...)
	follower.waitReady()

	held := leader.start(ctx(t), request("lane"))
	if got := routed(t, held); got != a.addr(e.port) {
		t.Fatalf("held request routed to %s, want %s", got, a.addr(e.port))
	}
	const queued = 3
	answers := make([]<-chan result, queued)
	for i := range answers {
		answers[i] = startAsync(leader, request("lane"))
	}
	leader.Metrics.Await(t, queued, "dynamo_frontend_router_queue_pending_requests", "policy_class", "lane")

	t0 := time.Now()
	if err := leader.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM the leader: %v", err)
	}
	for i, ch := range answers {
		r := launch.Receive(t, ch, fmt.Sprintf("queued request %d's answer after SIGTERM", i))
		if r.err != nil {
			t.Fatalf("queued request %d: %v", i, r.err)
		}
		d := r.ex.Decision()
		if d.Routed() || d.Immediate.Status != 503 || d.Immediate.Headers.Get("x-laneway-reason") != epp.ReasonShuttingDown {
			t.Fatalf("queued request %d answered %+v, want 503 %s", i, d, epp.ReasonShuttingDown)
		}
		_ = r.ex.Close()
	}

	// The Lease goes while the dispatched stream is still open: the
	// follower takes over at its next retry, well inside the drain.
	e.waitLease("held by the follower", func(l *coordinationv1.Lease) bool {
		return ptr.Deref(l.Spec.HolderIdentity, "") == follower.identity()
	})
	handover := time.Since(t0)
	select {
	case <-leader.Done():
		t.Fatalf("leader exited before the follower took over (%v after SIGTERM): its drain did not wait for the open stream", handover)
	default:
	}
	t.Logf("follower holds the Lease %v after the leader's SIGTERM, the leader still draining one stream", handover.Round(time.Millisecond))
	serve(t, follower.start(ctx(t), request("lane")))

	// The dispatched stream plays to its end on the draining leader, which
	// then exits 0 inside the drain timeout.
	serve(t, held)
	if err := leader.Wait(drainTimeout); err != nil {
		t.Fatalf("leader after its drain: %v", err)
	}
	exit := time.Since(t0)
	t.Logf("leader exited 0 %v after SIGTERM (drain timeout %v)", exit.Round(time.Millisecond), drainTimeout)
	// The drain ended with the stream, not at the timeout (a time bound
	// here would also count the handover and the race detector's exit).
	if strings.Contains(leader.Log.String(), "drain timeout reached") {
		t.Errorf("leader's drain ran into its timeout %v although its one stream had ended", drainTimeout)
	}
}

// electionFlags turn on leader election with the tests' short timing and
// the suite's replica identity, the replica link on a port the kernel
// picks.
func electionFlags() []string {
	return []string{
		"--ha-enable-leader-election",
		"--replica-cert-path=" + replicaIdentity,
		"--replica-port=0",
		"--leader-election-lease-duration=" + leaseDuration.String(),
		"--leader-election-renew-deadline=" + renewDeadline.String(),
		"--leader-election-retry-period=" + retryPeriod.String(),
	}
}

// usurpLease makes holder the holder of the pool's election Lease for a
// minute, as another candidate would: the present leader fails its next
// renewal.
func (e *env) usurpLease(holder string) {
	e.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var l coordinationv1.Lease
		if err := admin.Get(ctx(e.t), client.ObjectKey{Namespace: e.ns, Name: ha.LeaseName("pool")}, &l); err != nil {
			return err
		}
		now := metav1.NewMicroTime(time.Now())
		l.Spec.HolderIdentity = ptr.To(holder)
		l.Spec.AcquireTime, l.Spec.RenewTime = &now, &now
		l.Spec.LeaseDurationSeconds = ptr.To[int32](60)
		return admin.Update(ctx(e.t), &l)
	})
	if err != nil {
		e.t.Fatalf("take the Lease: %v", err)
	}
}
