package controller

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/laneway-dev/laneway/api/v1alpha1"
	"github.com/laneway-dev/laneway/pkg/policy"
	"github.com/laneway-dev/laneway/pkg/sched"
)

// PendingSource reports queue state (the dispatcher's Snapshot).
type PendingSource interface {
	Snapshot() (sched.Snapshot, bool)
}

// statusWriter publishes the policy controller's verdicts and the classes'
// pending counts on the objects' status. It runs on one replica at a time,
// the elected leader (the replica whose queue the counts describe; the
// picker's elector runs it for each term), and writes an object only when
// its status would change: at each new verdict, and every interval for the
// pending counts.
type statusWriter struct {
	client   client.Client
	pool     PoolRef
	interval time.Duration
	pending  PendingSource
	log      logr.Logger

	kick    chan struct{} // capacity 1: a new verdict is waiting
	mu      sync.Mutex
	verdict Verdict
	have    bool
}

func newStatusWriter(c client.Client, pool PoolRef, interval time.Duration, pending PendingSource, log logr.Logger) *statusWriter {
	return &statusWriter{client: c, pool: pool, interval: interval, pending: pending, log: log, kick: make(chan struct{}, 1)}
}

// Publish hands over a new verdict; it never blocks.
func (w *statusWriter) Publish(v Verdict) {
	w.mu.Lock()
	w.verdict, w.have = v, true
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: followers
// would write counts of a queue nobody uses. (The picker runs its own
// election and starts the writer per term; a manager that elects would
// start it once elected.)
func (w *statusWriter) NeedLeaderElection() bool { return true }

// Start implements manager.Runnable.
func (w *statusWriter) Start(ctx context.Context) error {
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		if err := w.write(ctx); err != nil && ctx.Err() == nil {
			w.log.Error(err, "status update failed; retrying at the next change or interval", "pool", w.pool.Name)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-w.kick:
		case <-t.C:
		}
	}
}

// write brings every judged object's status up to date.
func (w *statusWriter) write(ctx context.Context) error {
	w.mu.Lock()
	v, have := w.verdict, w.have
	w.mu.Unlock()
	if !have {
		return nil
	}
	pending := map[string]int64{}
	if snap, ok := w.pending.Snapshot(); ok {
		for _, c := range snap.Classes {
			pending[c.Name] = int64(c.Pending)
		}
	}
	var errs []error
	var cl v1alpha1.PolicyClassList
	if err := w.client.List(ctx, &cl, client.InNamespace(w.pool.Namespace)); err != nil {
		return fmt.Errorf("list PolicyClasses in %s: %w", w.pool.Namespace, err)
	}
	for i := range cl.Items {
		pc := &cl.Items[i]
		cond, ok := v.Conditions[policy.ObjectRef{Kind: policy.KindPolicyClass, Name: pc.Name}]
		if !ok || !w.pool.refersTo(pc.Spec.PoolRef) {
			continue
		}
		want := pc.DeepCopy()
		apimeta.SetStatusCondition(&want.Status.Conditions, cond)
		want.Status.ObservedGeneration = cond.ObservedGeneration
		// A class that is not in force has nothing queued under its name.
		want.Status.Pending = pending[policy.DRRName(pc.Spec.Model, pc.EffectiveClassName())]
		if err := w.patch(ctx, policy.KindPolicyClass, pc, want, equality.Semantic.DeepEqual(pc.Status, want.Status)); err != nil {
			errs = append(errs, err)
		}
	}
	var pl v1alpha1.PolicyProfileList
	if err := w.client.List(ctx, &pl, client.InNamespace(w.pool.Namespace)); err != nil {
		return errors.Join(append(errs, fmt.Errorf("list PolicyProfiles in %s: %w", w.pool.Namespace, err))...)
	}
	for i := range pl.Items {
		pp := &pl.Items[i]
		cond, ok := v.Conditions[policy.ObjectRef{Kind: policy.KindPolicyProfile, Name: pp.Name}]
		if !ok || !w.pool.refersTo(pp.Spec.PoolRef) {
			continue
		}
		want := pp.DeepCopy()
		apimeta.SetStatusCondition(&want.Status.Conditions, cond)
		want.Status.ObservedGeneration = cond.ObservedGeneration
		if ts := v.Tenants; ts != nil {
			want.Status.Identity, want.Status.TenantBindings = ts.Identity, ts.Bindings
		}
		if err := w.patch(ctx, policy.KindPolicyProfile, pp, want, equality.Semantic.DeepEqual(pp.Status, want.Status)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// patch writes want's status as a merge patch against have, unless same.
// An object deleted meanwhile is not an error: its verdict goes with it.
func (w *statusWriter) patch(ctx context.Context, kind string, have, want client.Object, same bool) error {
	if same {
		return nil
	}
	err := w.client.Status().Patch(ctx, want, client.MergeFrom(have))
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("patch status of %s %s/%s: %w", kind, want.GetNamespace(), want.GetName(), err)
	}
	w.log.V(3).Info("status written", "kind", kind, "name", want.GetName())
	return nil
}
