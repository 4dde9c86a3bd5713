package epp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// Leader election (SPEC §15). Every synced replica is a candidate on the
// pool's Lease; the holder runs the one queue (and writes status), the
// others forward their streams to it. The holder identity names the
// holder's ext_proc address, so a follower finds the leader from the Lease
// alone:
//
//	<name>_<ip:port>_<tag>
//
// name is the pod (the host name), ip:port the address the gateways reach
// this replica's ext_proc port at ($POD_IP, else the bind address, else
// the host name; and the bound port), and tag makes the identity unique
// per process: the pin of the self-signed serving certificate
// (forward.go's leaderTLS), else random. Pod names, addresses and tags
// contain no '_'.

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

// identityTag is pin when there is one, else 8 random bytes in hex.
func identityTag(pin string) string {
	if pin != "" {
		return pin
	}
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

// elector campaigns for the pool's Lease from the moment the replica is
// synced until the shutdown begins, and keeps following the Lease after
// that while the replica still serves (the shutdown delay), so that its
// last streams go to the next leader. Losing the Lease (a renewal failing
// past the renew deadline: another holder, or an API server that does not
// answer) demotes it to a follower that campaigns again; the process does
// not exit. While leading it runs lead (the status writer).
type elector struct {
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

func newElector(lock resourcelock.Interface, identity string, k *KubeOptions, synced, stopping <-chan struct{},
	lead func(context.Context) error, reg prometheus.Registerer, log logr.Logger) (*elector, error) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: MetricHALeader,
		Help: "1 while this replica holds the pool's leader-election Lease (its queue is the pool's), else 0.",
	})
	if err := reg.Register(g); err != nil {
		return nil, err
	}
	return &elector{
		lock:     &observedLock{Interface: lock, lease: k.LeaseDuration, now: time.Now},
		identity: identity, lease: k.LeaseDuration, renew: k.RenewDeadline, period: k.RetryPeriod,
		synced: synced, stopping: stopping, lead: lead, gauge: g, log: log,
	}, nil
}

// leader implements leaderView.
func (e *elector) leader() (string, bool) {
	if e.leading.Load() {
		return "", true
	}
	if h := e.lock.holder(); h != e.identity {
		return h, false
	}
	return "", false // our own old record: we are not leading any more
}

// Start implements manager.Runnable: it returns once ctx ends.
func (e *elector) Start(ctx context.Context) error {
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
			ReleaseOnCancel: true,
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

	// The shutdown delay: the Lease is released; keep reading it, so the
	// streams still arriving here go to the next leader.
	if ctx.Err() == nil {
		e.log.Info("shutting down: Lease released; following the next leader while still serving")
		wait.JitterUntilWithContext(ctx, func(ctx context.Context) { _, _, _ = e.lock.Get(ctx) }, e.period, 1.2, true)
	}
	return nil
}

// startedLeading runs the leader's work for one term, unless the term is
// already over (client-go starts this callback on a goroutine of its own,
// which may run after the term ended).
func (e *elector) startedLeading(term context.Context) {
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
func (e *elector) stoppedLeading(released bool) {
	e.mu.Lock()
	was := e.leading.Swap(false)
	e.gauge.Set(0)
	e.mu.Unlock()
	switch {
	case was && released:
		e.log.Info("stepped down: Lease released", "identity", e.identity)
	case was:
		e.log.Info("leader election lost: following the Lease, scheduling here while no leader is reachable; campaigning again", "identity", e.identity)
	}
}
