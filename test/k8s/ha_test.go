package k8s

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/laneway-dev/laneway/internal/ha"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

// TestFollowerForwardsToLeader: with leader election both synced replicas
// are ready, and a request sent to the follower is parsed there and sent
// to the leader as a ticket over the replica link (mutual TLS with the
// replica identity): it waits in the leader's one queue behind the
// leader's own dispatched request, not in a queue of the follower's, and
// is routed when that request ends. When the leader is SIGTERMed with a
// ticket still queued, the leader refuses it (shutting down) and the
// follower, which had not answered the gateway yet, decides it itself:
// it is routed there, once.
func TestFollowerForwardsToLeader(t *testing.T) {
	args := append(electionFlags(), "--secure-serving=true")
	e, a, leader, follower := forwardingPair(t, args, args)

	// One queue: the ticket waits behind the leader's own request.
	held := leader.start(ctx(t), request("lane"))
	routed(t, held)
	queued := startAsync(follower, request("lane"))
	leader.Metrics.Await(t, 1, "dynamo_frontend_router_queue_pending_requests", "policy_class", "lane")
	if got := follower.Metrics.Value(t, "dynamo_frontend_router_queue_pending_requests", "policy_class", "lane"); got != 0 {
		t.Errorf("follower's own queue holds %v requests, want 0: the ticket was not sent", got)
	}
	select {
	case r := <-queued:
		t.Fatalf("forwarded request answered while the leader's pod is busy: %+v %v", r.ex, r.err)
	default:
	}
	serve(t, held)
	r := launch.Receive(t, queued, "the forwarded request's decision once the leader's pod was free")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got := routed(t, r.ex); got != a.addr(e.port) {
		t.Fatalf("forwarded request routed to %s", got)
	}
	serve(t, r.ex)
	// Its release events reached the leader: its pod is idle again.
	leader.Metrics.Await(t, 0, "laneway_endpoint_in_flight_requests", "endpoint", a.addr(e.port))

	// The leader stops with a ticket queued: the follower decides it.
	held = leader.start(ctx(t), request("lane"))
	routed(t, held)
	queued = startAsync(follower, request("lane"))
	leader.Metrics.Await(t, 1, "dynamo_frontend_router_queue_pending_requests", "policy_class", "lane")
	if err := leader.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	r = launch.Receive(t, queued, "the forwarded request's answer after the leader's SIGTERM")
	if r.err != nil {
		t.Fatal(r.err)
	}
	serve(t, r.ex) // routed: not the leader's 503 shutting_down
	if got := follower.Metrics.Value(t, "laneway_ha_streams_total", "route", "fallback"); got != 1 {
		t.Errorf("follower fell back %v times, want 1", got)
	}
	serve(t, held) // the leader's dispatched stream plays to its end
	if err := leader.Wait(stopGrace); err != nil {
		t.Fatal(err)
	}
	logRoutes(t, follower)
}

// logRoutes logs where a replica's requests were decided.
func logRoutes(t *testing.T, p *eppProc) {
	t.Helper()
	m := p.Metrics.Read(t)
	t.Logf("%s: requests decided as leader %v, by the leader (tickets) %v, here %v, here after a failed ticket %v, by the next leader %v", p.Name,
		m.Value("laneway_ha_streams_total", "route", "leader"), m.Value("laneway_ha_streams_total", "route", "forwarded"),
		m.Value("laneway_ha_streams_total", "route", "local"), m.Value("laneway_ha_streams_total", "route", "fallback"),
		m.Value("laneway_ha_streams_total", "route", "reoffered"))
}

// TestTicketsCarryNoBody: a follower's requests waiting in the leader's
// queue are held by the follower (their bodies count in its
// --max-held-body-bytes), while the leader holds a ticket of a few
// hundred bytes each and no body at all.
func TestTicketsCarryNoBody(t *testing.T) {
	_, _, leader, follower := forwardingPair(t, electionFlags(), append(electionFlags(), "--max-body-bytes=200000"))
	held := leader.start(ctx(t), request("lane"))
	routed(t, held)
	big := request("lane")
	big.Body = []byte(`{"model":"m","prompt":"` + strings.Repeat("lorem ", 100<<10/6) + `","max_tokens":1}`)
	var queued []<-chan result
	for i := range 4 {
		queued = append(queued, startAsync(follower, big))
		leader.Metrics.Await(t, float64(i+1), "dynamo_frontend_router_queue_pending_requests", "policy_class", "lane")
	}
	if got, want := follower.Metrics.Value(t, "laneway_held_body_bytes"), float64(4*len(big.Body)); got < want {
		t.Errorf("follower holds %v body bytes for 4 waiting %d-byte requests, want at least %v", got, len(big.Body), want)
	}
	if got := leader.Metrics.Value(t, "laneway_held_body_bytes"); got != 0 {
		t.Errorf("leader holds %v body bytes with only tickets waiting, want 0", got)
	}
	serve(t, held)
	for i, q := range queued {
		r := launch.Receive(t, q, fmt.Sprintf("forwarded request %d's decision", i))
		if r.err != nil {
			t.Fatalf("forwarded request %d: %v", i, r.err)
		}
		serve(t, r.ex)
	}
}

// TestFollowerCrashGivesBackItsGrants: a follower is SIGKILLed with one
// request dispatched (by the leader's grant) and one ticket queued at the
// leader. The follower's link ends: the leader takes the ticket out of
// its queue and gives the grant back (the request's own stream died with
// the follower), so its pod is free for the next request at once.
func TestFollowerCrashGivesBackItsGrants(t *testing.T) {
	e, a, leader, follower := forwardingPair(t, electionFlags(), electionFlags())
	ep := a.addr(e.port)
	dispatched := follower.start(ctx(t), request("lane"))
	routed(t, dispatched)
	leader.Metrics.Await(t, 1, "laneway_endpoint_in_flight_requests", "endpoint", ep)
	startAsync(follower, request("lane"))
	leader.Metrics.Await(t, 1, "dynamo_frontend_router_queue_pending_requests", "policy_class", "lane")

	follower.Kill()
	leader.Metrics.Await(t, 0, "dynamo_frontend_router_queue_pending_requests", "policy_class", "lane")
	leader.Metrics.Await(t, 0, "laneway_endpoint_in_flight_requests", "endpoint", ep)
	m := leader.Metrics.Read(t)
	t.Logf("leader's tickets: granted %v, lost %v, cancelled %v", m.Value("laneway_ha_tickets_total", "outcome", "granted"),
		m.Value("laneway_ha_tickets_total", "outcome", "lost"), m.Value("laneway_ha_tickets_total", "outcome", "cancelled"))
	if got := m.Value("laneway_ha_tickets_total", "outcome", "lost"); got != 1 {
		t.Errorf("grants given back with the follower's link: %v, want 1", got)
	}
	serve(t, leader.start(ctx(t), request("lane"))) // the pod is free at once
}

// TestLeaderKilledReoffersTickets: the leader is SIGKILLed with a
// follower's ticket in its queue. The follower's link breaks, and the
// ticket is decided once, by the follower, while the dead leader's Lease
// runs out; once the follower holds the Lease it decides as the leader.
func TestLeaderKilledReoffersTickets(t *testing.T) {
	_, _, leader, follower := forwardingPair(t, electionFlags(), electionFlags())
	routed(t, leader.start(ctx(t), request("lane"))) // its pod busy, never served
	queued := startAsync(follower, request("lane"))
	leader.Metrics.Await(t, 1, "dynamo_frontend_router_queue_pending_requests", "policy_class", "lane")
	t0 := time.Now()
	leader.Kill()
	r := launch.Receive(t, queued, "the queued ticket's decision after the leader was killed")
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Logf("the killed leader's queued ticket was decided by the follower %v after the kill", time.Since(t0).Round(time.Millisecond))
	serve(t, r.ex)
	if got := follower.Metrics.Value(t, "laneway_ha_streams_total", "route", "fallback"); got != 1 {
		t.Errorf("follower decided %v tickets itself after the leader failed, want 1", got)
	}
	follower.Metrics.Await(t, 1, "laneway_ha_leader")
	before := follower.Metrics.Value(t, "laneway_ha_streams_total", "route", "leader")
	serve(t, follower.start(ctx(t), request("lane")))
	if after := follower.Metrics.Value(t, "laneway_ha_streams_total", "route", "leader"); after != before+1 {
		t.Errorf("decisions as leader %v -> %v, want +1", before, after)
	}
}

// TestNetworkCutBetweenReplicas: the replica link runs through a TCP
// proxy, which the test severs while the follower has one request
// dispatched by the leader's grant and one ticket queued there. Both
// replicas live on and the Lease stays the leader's. The follower decides
// the queued ticket itself, once; the leader takes it out of its queue
// and gives the grant back (its release can no longer arrive). When the
// network is back the follower sends tickets again, and the dispatched
// request's late events do not touch the leader's accounting.
func TestNetworkCutBetweenReplicas(t *testing.T) {
	e := newEnv(t, false)
	e.createPool("pool", "llm")
	a := e.addPod("a", podSpec{app: "llm", ready: true})
	ep := a.addr(e.port)
	e.create(policyClass("lane", "pool", 100, ptr.To[int64](0)))
	// The leader advertises a replica address on another loopback IP,
	// where the proxy listens, with the port it binds on 127.0.0.1.
	podIP := newIP()
	port, err := launch.FreePortOnAll([]string{"127.0.0.1", podIP})
	if err != nil {
		t.Fatal(err)
	}
	leader := e.startEPPEnv("epp-1", "pool", []string{"POD_IP=" + podIP}, append(electionFlags(), fmt.Sprintf("--replica-port=%d", port))...)
	leader.waitReady()
	e.waitClass("lane", "accepted", accepted("True", "Accepted"))
	proxy := startProxy(t, net.JoinHostPort(podIP, strconv.Itoa(port)), net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	follower := e.startEPP("epp-2", "pool", electionFlags()...)
	follower.waitReady()
	leader.waitEndpoints(time.Now(), followLimit, ep)
	follower.waitEndpoints(time.Now(), followLimit, ep)
	awaitForwarding(t, follower)

	dispatched := follower.start(ctx(t), request("lane"))
	routed(t, dispatched)
	leader.Metrics.Await(t, 1, "laneway_endpoint_in_flight_requests", "endpoint", ep)
	queued := startAsync(follower, request("lane"))
	leader.Metrics.Await(t, 1, "dynamo_frontend_router_queue_pending_requests", "policy_class", "lane")

	proxy.sever()
	r := launch.Receive(t, queued, "the queued ticket's decision after the cut")
	if r.err != nil {
		t.Fatal(r.err)
	}
	routed(t, r.ex) // decided by the follower, which knows of no load on the pod
	leader.Metrics.Await(t, 0, "dynamo_frontend_router_queue_pending_requests", "policy_class", "lane")
	leader.Metrics.Await(t, 0, "laneway_endpoint_in_flight_requests", "endpoint", ep)
	if got := follower.Metrics.Value(t, "laneway_ha_streams_total", "route", "fallback"); got != 1 {
		t.Errorf("follower decided %v tickets itself after the cut, want 1", got)
	}
	serve(t, dispatched) // its events go nowhere: the leader gave its grant back
	serve(t, r.ex)

	proxy.restore()
	before := follower.Metrics.Value(t, "laneway_ha_streams_total", "route", "forwarded")
	launch.WaitFor(t, func() string { return "the follower did not send tickets again after the network came back" }, func() bool {
		serve(t, follower.start(ctx(t), request("lane")))
		return follower.Metrics.Value(t, "laneway_ha_streams_total", "route", "forwarded") > before
	})
	leader.Metrics.Await(t, 0, "laneway_endpoint_in_flight_requests", "endpoint", ep)
	if got := leader.Metrics.Value(t, "laneway_ha_tickets_total", "outcome", "lost"); got != 1 {
		t.Errorf("leader gave back %v grants with the cut link, want 1", got)
	}
	logRoutes(t, follower)
}

// forwardingPair starts a pool with one ready pod "a" and a class "lane"
// whose threshold 0 makes the pod busy while one prefill is dispatched (the
// next request queues), a leader epp-1 and a follower epp-2 with their
// flags, and returns once both are ready, follow the pod, and the follower
// has sent the leader a ticket.
func forwardingPair(t *testing.T, leaderArgs, followerArgs []string) (e *env, a pod, leader, follower *eppProc) {
	t.Helper()
	e = newEnv(t, false)
	e.createPool("pool", "llm")
	a = e.addPod("a", podSpec{app: "llm", ready: true})
	e.create(policyClass("lane", "pool", 100, ptr.To[int64](0)))
	leader = e.startEPP("epp-1", "pool", leaderArgs...)
	leader.waitReady()
	e.waitClass("lane", "accepted", accepted("True", "Accepted"))
	follower = e.startEPP("epp-2", "pool", followerArgs...)
	follower.waitReady() // a synced follower is ready too
	if h := e.leaseHolder(); h != leader.identity() {
		t.Fatalf("Lease held by %q, want the first replica %q", h, leader.identity())
	}
	leader.waitEndpoints(time.Now(), followLimit, a.addr(e.port))
	follower.waitEndpoints(time.Now(), followLimit, a.addr(e.port))
	awaitForwarding(t, follower)
	return e, a, leader, follower
}

// awaitForwarding plays requests through the follower until one was sent
// to the leader as a ticket: the follower decides here until it has read
// the Lease and its link to the leader is up (the first request only
// starts the link).
func awaitForwarding(t *testing.T, follower *eppProc) {
	t.Helper()
	before := follower.Metrics.Value(t, "laneway_ha_streams_total", "route", "forwarded")
	launch.WaitFor(t, func() string { return "the follower never sent the leader a ticket" }, func() bool {
		serve(t, follower.start(ctx(t), request("lane")))
		return follower.Metrics.Value(t, "laneway_ha_streams_total", "route", "forwarded") > before
	})
}

// tcpProxy forwards connections from its address to a target until
// severed: then it closes every connection and refuses new ones, as a
// network cut that both ends notice; restore listens again.
type tcpProxy struct {
	t            *testing.T
	addr, target string
	mu           sync.Mutex
	ln           net.Listener
	conns        []net.Conn
}

func startProxy(t *testing.T, addr, target string) *tcpProxy {
	p := &tcpProxy{t: t, addr: addr, target: target}
	p.restore()
	t.Cleanup(p.sever)
	return p
}

func (p *tcpProxy) restore() {
	p.t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatalf("proxy listen on %s: %v", p.addr, err)
	}
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
}

func (p *tcpProxy) sever() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// TestRollingUpdate plays the Deployment controller of a two-replica
// rollout with maxSurge 1, maxUnavailable 0 under steady load: start a new
// replica, wait until it is Ready, SIGTERM an old one, wait for its exit;
// twice. The load goes round-robin over the Ready replicas, as through a
// Service. Every request is answered 200, and the Lease moves from the
// SIGTERMed leader to another replica within a retry period or so.
func TestRollingUpdate(t *testing.T) {
	e := newEnv(t, false)
	e.createPool("pool", "llm")
	a := e.addPod("a", podSpec{app: "llm", ready: true})
	b := e.addPod("b", podSpec{app: "llm", ready: true})
	// The shutdown delay outlasts the longest handover the test accepts
	// (a lease duration) with room for the late stream below.
	shutdownDelay := leaseDuration + 2*time.Second
	args := append(electionFlags(), "--shutdown-delay="+shutdownDelay.String())
	svc := newService(t)
	old := []*eppProc{e.startEPP("old-1", "pool", args...), e.startEPP("old-2", "pool", args...)}
	for _, p := range old {
		p.waitReady()
		p.waitEndpoints(time.Now(), followLimit, a.addr(e.port), b.addr(e.port))
		svc.follow(p)
	}
	load := svc.run(8)
	load.await(t, 100)

	for i, o := range old {
		n := e.startEPP(fmt.Sprintf("new-%d", i+1), "pool", args...)
		svc.follow(n)
		svc.awaitMember(t, n) // Ready: the Deployment controller may go on
		from := load.sent.Load()
		load.await(t, from+20)
		wasLeader := e.leaseHolder() == o.identity()
		t0 := time.Now()
		if err := o.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if wasLeader {
			l := e.waitLease("held by another replica", func(l *coordinationv1.Lease) bool {
				h := ptr.Deref(l.Spec.HolderIdentity, "")
				return h != "" && h != o.identity()
			})
			handover := time.Since(t0)
			t.Logf("%s (leader) SIGTERMed: %s holds the Lease %v later", o.Name, ptr.Deref(l.Spec.HolderIdentity, ""), handover.Round(time.Millisecond))
			if handover >= leaseDuration {
				t.Errorf("handover took %v, want well within the lease duration %v: the Lease was not released", handover, leaseDuration)
			}
		}
		// A gateway that has not yet seen the endpoint change: 1 s (or the
		// handover) into the shutdown delay its stream to the old replica
		// is still served there.
		time.Sleep(time.Until(t0.Add(time.Second))) // the scenario's point in time, not a wait for an event
		serve(t, o.start(ctx(t), request("")))
		if err := o.Wait(stopGrace); err != nil {
			t.Fatalf("%s after SIGTERM: %v", o.Name, err)
		}
		t.Logf("%s exited %v after SIGTERM", o.Name, time.Since(t0).Round(time.Millisecond))
	}
	from := load.sent.Load()
	load.await(t, from+50)
	st := load.stop(t)
	t.Logf("rolling update under load: %d requests sent, %d answered 200, %d failed", st.sent, st.ok, st.failed)
	for _, p := range svc.snapshot() {
		m := p.Metrics.Read(t)
		t.Logf("%s streams: leader %v, forwarded %v, local %v, fallback %v", p.Name,
			m.Value("laneway_ha_streams_total", "route", "leader"), m.Value("laneway_ha_streams_total", "route", "forwarded"),
			m.Value("laneway_ha_streams_total", "route", "local"), m.Value("laneway_ha_streams_total", "route", "fallback"))
	}
	if st.failed != 0 || st.ok != st.sent {
		t.Errorf("%d of %d requests failed during the rollout: %q", st.failed, st.sent, st.failures)
	}
}

// TestAPIServerOutage: two replicas under steady load while the API
// server is down for 60 s (etcd stays up). Requests keep being answered
// 200 from the endpoints and policy last read: the leader cannot renew and
// steps down after the renew deadline, the follower sees the Lease go
// stale, and both schedule locally; no process exits. Once the API server
// is back there is exactly one leader, the Lease's holder, within one
// lease duration.
func TestAPIServerOutage(t *testing.T) {
	const outage = 60 * time.Second
	e := newEnv(t, false)
	e.createPool("pool", "llm")
	a := e.addPod("a", podSpec{app: "llm", ready: true})
	b := e.addPod("b", podSpec{app: "llm", ready: true})
	svc := newService(t)
	rs := []*eppProc{e.startEPP("epp-1", "pool", electionFlags()...), e.startEPP("epp-2", "pool", electionFlags()...)}
	for _, p := range rs {
		p.waitReady()
		p.waitEndpoints(time.Now(), followLimit, a.addr(e.port), b.addr(e.port))
		svc.follow(p)
	}
	var leader string
	launch.WaitFor(t, func() string { return fmt.Sprintf("replicas leading: %q, want one", leader) }, func() bool {
		leader = leaders(t, rs)
		return leader == rs[0].Name || leader == rs[1].Name
	})
	load := svc.run(8)
	load.await(t, 100)

	before := load.snapshot()
	down := false
	t.Cleanup(func() {
		if down {
			_ = cluster.StartAPIServer() // for the tests after this one
		}
	})
	t0 := time.Now()
	down = true
	if err := cluster.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	t.Logf("API server stopped (%v to exit)", time.Since(t0).Round(time.Millisecond))
	launch.WaitWithin(t, renewDeadline+2*time.Second, func() string { return "the leader still leads without an API server" },
		func() bool { return leaders(t, rs) == "" })
	t.Logf("no replica leads %v after the API server was stopped (renew deadline %v)", time.Since(t0).Round(time.Millisecond), renewDeadline)
	time.Sleep(time.Until(t0.Add(outage))) // the outage's length: the scenario, not a wait for an event
	during := load.snapshot().minus(before)
	for _, p := range rs {
		if err := p.Exited(); err != nil {
			t.Fatalf("during the outage: %v", err)
		}
		if st := health(t, p); st != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("%s readiness %v during the outage, want SERVING", p.Name, st)
		}
	}
	if err := cluster.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	down = false
	back := time.Now()
	t.Logf("API server back after %v", back.Sub(t0).Round(time.Millisecond))

	var who, holder string
	launch.WaitWithin(t, leaseDuration, func() string {
		return fmt.Sprintf("after the API server returned: replicas leading %q, Lease holder %q", who, holder)
	}, func() bool {
		who = leaders(t, rs)
		holder = e.leaseHolderOrNone()
		for _, p := range rs {
			if p.Name == who && p.identity() == holder {
				return true
			}
		}
		return false
	})
	t.Logf("one leader (%s) %v after the API server returned (lease %v)", who, time.Since(back).Round(time.Millisecond), leaseDuration)
	if who != leader {
		t.Logf("the leader changed: %s before, %s after", leader, who)
	}
	load.await(t, load.sent.Load()+50)
	st := load.stop(t)
	t.Logf("API server down %v under load: %d requests sent during the outage, %d answered 200, %d failed; whole test %d sent, %d 200, %d failed",
		outage, during.sent, during.ok, during.failed, st.sent, st.ok, st.failed)
	if during.ok == 0 {
		t.Error("no request answered during the outage")
	}
	if st.failed != 0 || st.ok != st.sent {
		t.Errorf("%d of %d requests failed: %q", st.failed, st.sent, st.failures)
	}
}

// leaders names the replicas that report holding the Lease
// (laneway_ha_leader), "" for none.
func leaders(t *testing.T, rs []*eppProc) string {
	t.Helper()
	var names string
	for _, p := range rs {
		if p.Metrics.Value(t, "laneway_ha_leader") == 1 {
			if names != "" {
				names += ","
			}
			names += p.Name
		}
	}
	return names
}

// identity is the holder identity the replica logged at start.
func (p *eppProc) identity() string {
	p.t.Helper()
	var line struct{ Identity string }
	if err := json.Unmarshal([]byte(p.WaitLog(p.t, "endpoint picker serving")), &line); err != nil || line.Identity == "" {
		p.t.Fatalf("%s: no identity in its serving line (%v)", p.Name, err)
	}
	return line.Identity
}

// waitLease watches the pool's Lease until cond holds and returns it.
func (e *env) waitLease(what string, cond func(*coordinationv1.Lease) bool) *coordinationv1.Lease {
	e.t.Helper()
	return waitObject(e, &coordinationv1.LeaseList{}, ha.LeaseName("pool"), what, cond)
}

// waitLeaseFor is waitLease failing after timeout.
func (e *env) waitLeaseFor(timeout time.Duration, what string, cond func(*coordinationv1.Lease) bool) *coordinationv1.Lease {
	e.t.Helper()
	return waitObjectFor(e, timeout, &coordinationv1.LeaseList{}, ha.LeaseName("pool"), what, cond)
}

// service plays a Kubernetes Service over picker replicas with the
// endpoints controller behind it: a replica is a member while its
// readiness reports SERVING, and streams go round-robin over the members.
type service struct {
	t       *testing.T
	mu      sync.Mutex
	members []*eppProc
	next    int
	changed chan struct{} // closed and replaced at every change
}

func newService(t *testing.T) *service { return &service{t: t, changed: make(chan struct{})} }

// follow adds p while its readiness is SERVING.
func (s *service) follow(p *eppProc) {
	ch := p.watchReadiness()
	go func() {
		for st := range ch {
			s.set(p, st == healthpb.HealthCheckResponse_SERVING)
		}
		s.set(p, false)
	}()
}

func (s *service) set(p *eppProc, member bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := -1
	for j, m := range s.members {
		if m == p {
			i = j
		}
	}
	switch {
	case member && i < 0:
		s.members = append(s.members, p)
	case !member && i >= 0:
		s.members = append(s.members[:i], s.members[i+1:]...)
	default:
		return
	}
	close(s.changed)
	s.changed = make(chan struct{})
}

// awaitMember waits until p is a member.
func (s *service) awaitMember(t *testing.T, p *eppProc) {
	t.Helper()
	deadline := time.After(launch.DefaultReadyTimeout)
	for {
		s.mu.Lock()
		ch, in := s.changed, false
		for _, m := range s.members {
			in = in || m == p
		}
		s.mu.Unlock()
		if in {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("%s not Ready within %v\n%s", p.Name, launch.DefaultReadyTimeout, p.Log.Tail(16<<10))
		}
	}
}

// snapshot returns the members.
func (s *service) snapshot() []*eppProc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.members)
}

// pick is the member the next stream goes to; nil when there is none.
func (s *service) pick() *eppProc {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.members) == 0 {
		return nil
	}
	s.next++
	return s.members[s.next%len(s.members)]
}

// loadRate is the steady load's request rate: enough to have streams in
// flight at every moment of a rollout or an outage, little enough to leave
// the shared test machine's CPU to the pickers.
const loadRate = 200

// loadGen is steady load through a service: loadRate requests a second,
// each played to its end as a gateway would by one of a few workers.
type loadGen struct {
	svc              *service
	sent, ok, failed atomic.Int64
	stopping         atomic.Bool
	wg               sync.WaitGroup
	mu               sync.Mutex
	failures         []string // the first few
}

// counts is a snapshot of a load's counters.
type counts struct {
	sent, ok, failed int64
	failures         []string
}

func (c counts) minus(o counts) counts {
	return counts{sent: c.sent - o.sent, ok: c.ok - o.ok, failed: c.failed - o.failed}
}

// run starts workers sending through the service at loadRate until stop.
func (s *service) run(workers int) *loadGen {
	l := &loadGen{svc: s}
	tr := &http.Transport{MaxIdleConnsPerHost: workers}
	s.t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, Timeout: launch.EventTimeout}
	tick := time.NewTicker(time.Second / loadRate)
	s.t.Cleanup(tick.Stop)
	for range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for !l.stopping.Load() {
				<-tick.C // the rate: pacing, not synchronisation
				l.sent.Add(1)
				if err := l.one(hc); err != nil {
					l.failed.Add(1)
					l.mu.Lock()
					if len(l.failures) < 10 {
						l.failures = append(l.failures, err.Error())
					}
					l.mu.Unlock()
					continue
				}
				l.ok.Add(1)
			}
		}()
	}
	s.t.Cleanup(func() { l.stopping.Store(true); l.wg.Wait() })
	return l
}

// one sends one request to the next member and plays it to its end.
func (l *loadGen) one(hc *http.Client) error {
	p := l.svc.pick()
	if p == nil { // the workers' shared ticker paces the retries
		return fmt.Errorf("no Ready replica")
	}
	c, cancel := context.WithTimeout(context.Background(), launch.EventTimeout)
	defer cancel()
	ex, err := p.client.Start(c, request(""))
	if err != nil {
		return fmt.Errorf("%s: %w", p.Name, err)
	}
	defer ex.Close()
	d := ex.Decision()
	if !d.Routed() {
		return fmt.Errorf("%s answered %d %s: %s", p.Name, d.Immediate.Status, d.Immediate.Headers.Get("x-laneway-reason"), d.Immediate.Body)
	}
	resp, err := hc.Post("http://"+d.Endpoints[0]+"/v1/completions", "application/json", bytes.NewReader(d.Body))
	if err != nil {
		return fmt.Errorf("upstream %s: %w", d.Endpoints[0], err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		return fmt.Errorf("upstream %s: %d %v", d.Endpoints[0], resp.StatusCode, err)
	}
	if _, _, err := ex.Respond(resp.StatusCode, http.Header{"content-type": {"application/json"}}, body); err != nil {
		return fmt.Errorf("%s: response phases: %w", p.Name, err)
	}
	return nil
}

// await waits until n requests were sent.
func (l *loadGen) await(t *testing.T, n int64) {
	t.Helper()
	launch.WaitFor(t, func() string { return fmt.Sprintf("load sent %d requests, want %d", l.sent.Load(), n) },
		func() bool { return l.sent.Load() >= n })
}

func (l *loadGen) snapshot() counts {
	// ok and failed are counted after sent: read them first, so that
	// sent >= ok + failed in every snapshot.
	ok, failed := l.ok.Load(), l.failed.Load()
	return counts{sent: l.sent.Load(), ok: ok, failed: failed}
}

// stop ends the load after the requests in flight and returns the counts.
func (l *loadGen) stop(t *testing.T) counts {
	t.Helper()
	l.stopping.Store(true)
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return counts{sent: l.sent.Load(), ok: l.ok.Load(), failed: l.failed.Load(), failures: l.failures}
}

// leaseHolderOrNone is the Lease's holder, "" when it has none or cannot
// be read.
func (e *env) leaseHolderOrNone() string {
	var l coordinationv1.Lease
	c, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := admin.Get(c, client.ObjectKey{Namespace: e.ns, Name: ha.LeaseName("pool")}, &l); err != nil {
		return ""
	}
	return ptr.Deref(l.Spec.HolderIdentity, "")
}
