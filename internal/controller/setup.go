package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/laneway-dev/laneway/api/v1alpha1"
)

// NewScheme returns a scheme with every kind the controllers read: the
// built-in kinds (pods, leases, events), Laneway's policy kinds and the
// InferencePool v1 kinds.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1alpha1.AddToScheme, inferencev1.Install} {
		if err := add(s); err != nil {
			return nil, fmt.Errorf("build scheme: %w", err)
		}
	}
	return s, nil
}

// Dispatcher is what the controllers drive: endpoints, policy and the
// queue counts for status.
type Dispatcher interface {
	EndpointSink
	PolicySink
	PendingSource
}

// Config configures Setup.
type Config struct {
	// Pool is the InferencePool to follow.
	Pool PoolRef
	// DefaultMaxBatchedTokens is the max_num_batched_tokens of pods without
	// the laneway.dev/max-num-batched-tokens annotation.
	DefaultMaxBatchedTokens uint64
	// RoleLabel is the pod label key of a pod's prefill/decode role; empty
	// means DefaultRoleLabel.
	RoleLabel string
	// StatusInterval bounds how often pending counts are written.
	StatusInterval time.Duration
	// Dispatcher receives the snapshots.
	Dispatcher Dispatcher
	// Log is the controllers' logger.
	Log logr.Logger
	// PolicyAccepted, when set, is called after every resync of the
	// policy controller: true when the pool's policy objects are valid and
	// in force, false when they were rejected (the last valid policy, or
	// before any, the synthetic default, stays in force).
	PolicyAccepted func(bool)
}

// Controllers are the registered controllers of one pool.
type Controllers struct {
	synced  chan struct{}
	applied chan struct{}
	status  *statusWriter
}

// Synced is closed once both the endpoint set and the policy were read from
// the (synced) cache and the results handed to the dispatcher.
func (c *Controllers) Synced() <-chan struct{} { return c.synced }

// PolicyApplied is closed once a valid set of the pool's policy objects
// (no objects at all is one: the synthetic default class) was handed to
// the dispatcher. Until then the pool's objects were invalid from the
// start, and the dispatcher holds the synthetic default only as a
// placeholder.
func (c *Controllers) PolicyApplied() <-chan struct{} { return c.applied }

// StatusWriter is the runnable that writes the objects' status. Setup does
// not add it to the manager: it must run on exactly one replica at a time,
// the one whose queue the pending counts describe (the elected leader).
func (c *Controllers) StatusWriter() manager.Runnable { return c.status }

// Setup registers the endpoint and policy controllers (on every replica)
// with mgr and builds the status writer (see StatusWriter). mgr's cache
// must cover the pool's namespace.
func Setup(mgr manager.Manager, cfg Config) (*Controllers, error) {
	if cfg.Pool.Name == "" || cfg.Pool.Namespace == "" {
		return nil, errors.New("controller setup: pool name and namespace are required")
	}
	if cfg.StatusInterval <= 0 {
		return nil, fmt.Errorf("controller setup: status interval %s must be positive", cfg.StatusInterval)
	}
	c := &Controllers{synced: make(chan struct{}), applied: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { wg.Wait(); close(c.synced) }()
	once := func() func() { var o sync.Once; return func() { o.Do(wg.Done) } }

	key := reconcile.Request{NamespacedName: cfg.Pool.NamespacedName}
	toPool := func(context.Context, client.Object) []reconcile.Request { return []reconcile.Request{key} }
	// kickoff enqueues the pool once at start, so that the first resync
	// happens even when no object exists to cause an event.
	kickoff := source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		q.Add(key)
		return nil
	})
	// Both controllers run on followers too (warm dispatcher for a fast
	// failover); the name check is off because tests build several
	// managers in one process.
	opts := controller.Options{NeedLeaderElection: ptr.To(false), SkipNameValidation: ptr.To(true), MaxConcurrentReconciles: 1}

	log := cfg.Log
	er := &endpointReconciler{
		reader:     mgr.GetClient(),
		pool:       cfg.Pool.NamespacedName,
		defaultMax: cfg.DefaultMaxBatchedTokens,
		roleLabel:  cmp.Or(cfg.RoleLabel, DefaultRoleLabel),
		sink:       cfg.Dispatcher,
		log:        log.WithName("endpoints"),
		synced:     once(),
	}
	isPool := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetName() == cfg.Pool.Name && o.GetNamespace() == cfg.Pool.Namespace
	})
	err := ctrl.NewControllerManagedBy(mgr).
		Named("laneway-endpoints").
		WithOptions(opts).
		Watches(&inferencev1.InferencePool{}, handler.EnqueueRequestsFromMapFunc(toPool), builder.WithPredicates(isPool)).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(er.podToPool)).
		WatchesRawSource(kickoff).
		Complete(er)
	if err != nil {
		return nil, fmt.Errorf("set up the endpoint controller: %w", err)
	}

	sw := newStatusWriter(mgr.GetClient(), cfg.Pool, cfg.StatusInterval, cfg.Dispatcher, log.WithName("status"))
	c.status = sw
	var applied sync.Once
	pr := &policyReconciler{
		reader:  mgr.GetClient(),
		pool:    cfg.Pool,
		sink:    cfg.Dispatcher,
		publish: sw.Publish,
		log:     log.WithName("policy"),
		synced:  once(),
		accepted: func(ok bool) {
			if ok {
				applied.Do(func() { close(c.applied) })
			}
			if cfg.PolicyAccepted != nil {
				cfg.PolicyAccepted(ok)
			}
		},
	}
	// Status writes do not change metadata.generation, so the writer's own
	// updates do not come back as resyncs.
	refersToPool := predicate.NewPredicateFuncs(func(o client.Object) bool {
		switch o := o.(type) {
		case *v1alpha1.PolicyClass:
			return cfg.Pool.refersTo(o.Spec.PoolRef)
		case *v1alpha1.PolicyProfile:
			return cfg.Pool.refersTo(o.Spec.PoolRef)
		}
		return false
	})
	preds := builder.WithPredicates(refersToPool, predicate.GenerationChangedPredicate{})
	err = ctrl.NewControllerManagedBy(mgr).
		Named("laneway-policy").
		WithOptions(opts).
		Watches(&v1alpha1.PolicyClass{}, handler.EnqueueRequestsFromMapFunc(toPool), preds).
		Watches(&v1alpha1.PolicyProfile{}, handler.EnqueueRequestsFromMapFunc(toPool), preds).
		WatchesRawSource(kickoff).
		Complete(pr)
	if err != nil {
		return nil, fmt.Errorf("set up the policy controller: %w", err)
	}
	return c, nil
}

// podToPool maps a pod event to the pool's resync when the pod matches the
// pool's selector. Update events are mapped for the old and the new object
// both, so a pod that stops matching still causes a resync; a selector
// change resyncs through the pool's own event.
func (r *endpointReconciler) podToPool(ctx context.Context, o client.Object) []reconcile.Request {
	if o.GetNamespace() != r.pool.Namespace {
		return nil
	}
	var pool inferencev1.InferencePool
	if err := r.reader.Get(ctx, r.pool, &pool); err != nil {
		return nil // no pool (yet): its creation resyncs
	}
	sel := poolSelector(&pool)
	if sel == nil || !sel.Matches(labels.Set(o.GetLabels())) {
		return nil
	}
	return []reconcile.Request{{NamespacedName: r.pool}}
}
