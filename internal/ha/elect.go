package ha

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
)

// Leader election (SPEC §15). Every synced replica is a candidate on the
// pool's Lease; the holder runs the one queue (and writes status), the
// others send it their tickets. The holder identity names the holder's
// replica-link address, so a follower finds the leader from the Lease
// alone:
//
//	<name>_<ip:port>_<tag>
//
// name is the pod (the host name), ip:port the address the other
// replicas reach this one's replica link at ($POD_IP, else the bind
// address, else the host name; and the link's bound port), and tag, 8
// random bytes in hex, makes the identity unique per process. Pod names,
// addresses and tags contain no '_'. (Replicas before the replica link
// named their ext_proc port here and pinned its certificate in the tag;
// such a leader refuses the link, and its followers' streams, proxied to
// the link's port, fall back to their own scheduler.)

// Identity is this process's holder identity for its replica link bound
// at bound: named after $POD_NAME (else the host name), advertising the
// address followers dial (advertiseAddr), tagged at random.
func Identity(bound net.Addr) string {
	name := os.Getenv("POD_NAME")
	if name == "" {
		name, _ = os.Hostname()
	}
	name = strings.ReplaceAll(name, "_", "-") // '_' separates the identity's fields
	return holderIdentity(name, advertiseAddr(bound), identityTag())
}

// LeaseName is the leader-election Lease of a pool's pickers.
func LeaseName(pool string) string { return "laneway-epp-" + pool }

// LeaseLock is the lock on pool's Lease in namespace, held as identity,
// through the API server cfg reaches. Each of its requests is bounded by
// timeout (the renew deadline): one that hangs (a partition) would stall
// a follower's campaign.
func LeaseLock(cfg *rest.Config, namespace, pool, identity string, timeout time.Duration) (resourcelock.Interface, error) {
	lcfg := rest.CopyConfig(cfg)
	lcfg.Timeout = timeout
	coord, err := coordinationv1client.NewForConfig(lcfg)
	if err != nil {
		return nil, fmt.Errorf("leader election client: %w", err)
	}
	return &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: namespace, Name: LeaseName(pool)},
		Client:     coord,
		LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
	}, nil
}

// holderIdentity builds this process's holder identity.
func holderIdentity(name, addr, tag string) string { return name + "_" + addr + "_" + tag }

// parseHolder splits a holder identity into the leader's address and tag.
func parseHolder(id string) (addr, tag string, ok bool) {
	i, j := strings.IndexByte(id, '_'), strings.LastIndexByte(id, '_')
	if i < 0 || j <= i+1 {
		return "", "", false
	}
	addr, tag = id[i+1:j], id[j+1:]
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return "", "", false
	}
	return addr, tag, true
}

// advertiseAddr is the address followers dial for this replica's ext_proc
// port bound at bound: the pod IP from the downward API ($POD_IP), else
// the bound IP unless it is unspecified, else the host name.
func advertiseAddr(bound net.Addr) string {
	host, port, err := net.SplitHostPort(bound.String())
	if err != nil {
		return bound.String()
	}
	if ip := os.Getenv("POD_IP"); ip != "" {
		host = ip
	} else if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		if h, err := os.Hostname(); err == nil {
			host = h
		}
	}
	return net.JoinHostPort(host, port)
}

// identityTag is 8 random bytes in hex.
func identityTag() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand does not fail on Linux
	return hex.EncodeToString(b[:])
}

// observedLock is the Lease lock with a record of what it last saw: the
// holder, and when (by this replica's clock) the record last changed, as
// client-go's elector judges expiry. Every candidate reads the Lease each
// retry period, so a follower knows the leader, and knows when it stopped
// renewing (or the API server stopped answering) for a lease duration.
type observedLock struct {
	resourcelock.Interface
	lease time.Duration // default when the record states none
	now   func() time.Time
	seen  atomic.Pointer[observation]
}

// observation is one record seen, immutable once stored.
type observation struct {
	holder   string
	renew    time.Time
	duration time.Duration
	changed  time.Time
}

// Get implements resourcelock.Interface.
func (l *observedLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	r, raw, err := l.Interface.Get(ctx)
	if err == nil {
		l.observe(r)
	}
	return r, raw, err
}

// Create implements resourcelock.Interface.
func (l *observedLock) Create(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	err := l.Interface.Create(ctx, r)
	if err == nil {
		l.observe(&r)
	}
	return err
}

// Update implements resourcelock.Interface.
func (l *observedLock) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	err := l.Interface.Update(ctx, r)
	if err == nil {
		l.observe(&r)
	}
	return err
}

func (l *observedLock) observe(r *resourcelock.LeaderElectionRecord) {
	o := &observation{holder: r.HolderIdentity, renew: r.RenewTime.Time, duration: time.Duration(r.LeaseDurationSeconds) * time.Second}
	if o.duration <= 0 {
		o.duration = l.lease
	}
	prev := l.seen.Load()
	if prev != nil && prev.holder == o.holder && prev.renew.Equal(o.renew) {
		return // unchanged: not a renewal
	}
	o.changed = l.now()
	l.seen.Store(o)
}

// holder returns the holder last seen while its lease is fresh: renewed,
// as far as this replica saw, within the lease duration. "" otherwise:
// no holder, a released Lease, or one not seen renewed (a dead leader, or
// an API server that does not answer).
func (l *observedLock) holder() string {
	o := l.seen.Load()
	if o == nil || o.holder == "" || l.now().Sub(o.changed) >= o.duration {
		return ""
	}
	return o.holder
}

// ElectorConfig configures NewElector.
type ElectorConfig struct {
	// Lock is the pool's Lease (LeaseLock), held as Identity.
	Lock     resourcelock.Interface
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod tune the election as
	// client-go's elector takes them (--leader-election-*).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Synced is closed once the replica may campaign (its controllers
	// synced); Stopping once the shutdown began (the Lease is released).
	Synced, Stopping <-chan struct{}
	// Lead, when set, is the leader's work (the status writer), run for
	// each term this replica leads, until the term's context ends.
	Lead func(context.Context) error
	// Registry gets the laneway_ha_leader gauge.
	Registry prometheus.Registerer
	Log      logr.Logger
}

// Elector campaigns for the pool's Lease from the moment the replica is
// synced until the shutdown begins, and keeps following the Lease after
// that while the replica still serves (the shutdown delay), so that its
// last streams go to the next leader. Losing the Lease (a renewal failing
// past the renew deadline: another holder, or an API server that does not
// answer) demotes it to a follower that campaigns again; the process does
// not exit. While leading it runs the config's Lead.
type Elector struct {
	lock                 *observedLock
	identity             string
	lease, renew, period time.Duration
	synced               <-chan struct{}
	stopping             <-chan struct{}
	lead                 func(context.Context) error
	gauge                prometheus.Gauge
	log                  logr.Logger

	mu      sync.Mutex // orders leading's changes against the callbacks' race
	leading atomic.Bool
}

// NewElector returns an elector for cfg, its gauge registered; Run starts
// it.
func NewElector(cfg ElectorConfig) (*Elector, error) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: MetricLeader,
		Help: "1 while this replica holds the pool's leader-election Lease (its queue is the pool's), else 0.",
	})
	if err := cfg.Registry.Register(g); err != nil {
		return nil, fmt.Errorf("register %s: %w", MetricLeader, err)
	}
	return &Elector{
		lock:     &observedLock{Interface: cfg.Lock, lease: cfg.LeaseDuration, now: time.Now},
		identity: cfg.Identity, lease: cfg.LeaseDuration, renew: cfg.RenewDeadline, period: cfg.RetryPeriod,
		synced: cfg.Synced, stopping: cfg.Stopping, lead: cfg.Lead, gauge: g, log: cfg.Log,
	}, nil
}

// IsLeader reports whether this replica holds the Lease now (a term of
// its own has started and not ended).
func (e *Elector) IsLeader() bool { return e.leading.Load() }

// Leader is the holder identity of the leader to send tickets to: another
// replica whose hold on the Lease this one saw renewed within its
// duration. "" when there is none: this replica leads, no fresh holder is
// known, or the record still names this replica after its term ended.
func (e *Elector) Leader() string {
	if e.leading.Load() {
		return ""
	}
	if h := e.lock.holder(); h != e.identity {
		return h
	}
	return "" // our own old record: we are not leading any more
}

// Run campaigns and follows the Lease as the type says, and returns once
// ctx ends (the drain), after any term's leader work returned.
func (e *Elector) Run(ctx context.Context) error {
	select {
	case <-e.synced:
	case <-ctx.Done():
		return nil
	}
	ctx = klog.NewContext(ctx, e.log)
	campaign, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		select {
		case <-e.stopping:
			stop()
		case <-campaign.Done():
		}
	}()
	e.log.Info("caches synced; campaigning for the Lease", "identity", e.identity)

	var mu sync.Mutex
	var terms sync.WaitGroup
	over := false
	for campaign.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            e.lock,
			LeaseDuration:   e.lease,
			RenewDeadline:   e.renew,
			RetryPeriod:     e.period,
			ReleaseOnCancel: false, // release below, retried on conflict
			Name:            e.lock.Describe(),
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(term context.Context) {
					mu.Lock()
					if over {
						mu.Unlock()
						return
					}
					terms.Add(1)
					mu.Unlock()
					defer terms.Done()
					e.startedLeading(term)
				},
				OnStoppedLeading: func() { e.stoppedLeading(campaign.Err() != nil) },
			},
		})
		if err != nil {
			return err
		}
		le.Run(campaign)
	}
	mu.Lock()
	over = true
	mu.Unlock()
	terms.Wait()
	e.release(ctx)

	// The shutdown delay: the Lease is released; keep reading it, so the
	// streams still arriving here go to the next leader.
	if ctx.Err() == nil {
		e.log.Info("shutting down: following the next leader while still serving")
		wait.JitterUntilWithContext(ctx, func(ctx context.Context) { _, _, _ = e.lock.Get(ctx) }, e.period, 1.2, true)
	}
	return nil
}

// release gives up the Lease at the shutdown if its record still names
// this replica, so the next leader need not wait out the lease duration.
// client-go's own release reads the Lease once and writes once; a renewal
// the shutdown cancelled can still land on the API server between the two
// and turn the write into a conflict, leaving the Lease held (seen under
// load: a 4 s handover against a 3 s lease). This one reads again and
// retries on conflict, within the renew deadline. It also releases a
// record left naming this replica by a term lost just before the stop.
func (e *Elector) release(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.renew)
	defer cancel()
	held := false
	err := retry.OnError(retry.DefaultRetry, apierrors.IsConflict, func() error {
		rec, _, err := e.lock.Get(ctx)
		if err != nil {
			return err
		}
		if held = rec.HolderIdentity == e.identity; !held {
			return nil // another holder, or already released
		}
		now := metav1.Now()
		return e.lock.Update(ctx, resourcelock.LeaderElectionRecord{
			LeaderTransitions:    rec.LeaderTransitions,
			LeaseDurationSeconds: 1,
			AcquireTime:          now,
			RenewTime:            now,
		})
	})
	switch {
	case err != nil:
		e.log.Error(err, "could not release the Lease: the next leader takes it when it expires", "lease", e.lease)
	case held:
		e.log.Info("Lease released", "identity", e.identity)
	}
}

// startedLeading runs the leader's work for one term, unless the term is
// already over (client-go starts this callback on a goroutine of its own,
// which may run after the term ended).
func (e *Elector) startedLeading(term context.Context) {
	e.mu.Lock()
	if term.Err() != nil {
		e.mu.Unlock()
		return
	}
	e.leading.Store(true)
	e.gauge.Set(1)
	e.mu.Unlock()
	e.log.Info("elected leader: this replica's queue is the pool's", "identity", e.identity)
	if e.lead != nil {
		if err := e.lead(term); err != nil && term.Err() == nil {
			e.log.Error(err, "leader work stopped")
		}
	}
	<-term.Done()
}

// stoppedLeading ends a term: released at the shutdown, or lost.
func (e *Elector) stoppedLeading(released bool) {
	e.mu.Lock()
	was := e.leading.Swap(false)
	e.gauge.Set(0)
	e.mu.Unlock()
	switch {
	case was && released:
		e.log.Info("stepped down: the shutdown began", "identity", e.identity)
	case was:
		e.log.Info("leader election lost: following the Lease, scheduling here while no leader is reachable; campaigning again", "identity", e.identity)
	}
}
