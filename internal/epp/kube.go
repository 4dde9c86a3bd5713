package epp

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/laneway-dev/laneway/internal/controller"
	"github.com/laneway-dev/laneway/internal/dispatcher"
	"github.com/laneway-dev/laneway/pkg/policy"
)

// RunKube is the endpoint picker in Kubernetes mode: endpoints from the
// pods of --pool-name, policy from the pool's PolicyClass and PolicyProfile
// objects. It is ready once the caches synced and both were handed to the
// dispatcher, and, with leader election, only while it holds the Lease; a
// follower answers 503 not_leader. It returns when ctx ends and the drain
// is over, or with an error when leadership is lost (the process should
// exit and start again as a follower).
func RunKube(ctx context.Context, opts *Options, log logr.Logger) error {
	// client-go (leader election) logs through klog and controller-runtime
	// through its own global; both go to the picker's logger.
	klog.SetLogger(log.WithName("client-go"))
	ctrl.SetLogger(log)

	cfg, err := restConfig(opts.Kube.Kubeconfig)
	if err != nil {
		return err
	}
	mgr, err := newManager(cfg, &opts.Kube, log)
	if err != nil {
		return err
	}
	// Until the pool's objects are read the synthetic default class is in
	// force; the server is not ready before then anyway.
	initial, err := (&policy.Config{}).Compile()
	if err != nil {
		return fmt.Errorf("compile the default policy: %w", err)
	}
	srv, err := NewServer(opts, dispatcher.FromCompiled(initial), BodyParser{}, log)
	if err != nil {
		return err
	}
	pool := controller.PoolRef{Group: opts.Kube.PoolGroup, NamespacedName: types.NamespacedName{Namespace: opts.Kube.PoolNamespace, Name: opts.Kube.PoolName}}
	ctrls, err := controller.Setup(mgr, controller.Config{
		Pool:                    pool,
		DefaultMaxBatchedTokens: opts.MaxNumBatchedTokens,
		StatusInterval:          opts.Kube.StatusInterval,
		Dispatcher:              srv.Dispatcher(),
		Log:                     log.WithName("controller"),
	})
	if err != nil {
		srv.closeListeners()
		return err
	}
	grpcAddr, healthAddr, metricsAddr := srv.Addrs()
	log.Info("endpoint picker serving (Kubernetes mode)", "grpc", grpcAddr, "health", healthAddr, "metrics", metricsAddr,
		"tls", opts.SecureServing, "pool", pool.String(), "leaderElection", opts.Kube.LeaderElection)

	// The manager stops with ctx (SIGTERM) or on its own (leadership lost);
	// either way the server drains. Cancelling the manager releases a held
	// Lease, so a follower takes over while this replica drains.
	mgrCtx, stopMgr := context.WithCancel(ctx)
	defer stopMgr()
	srvCtx, stopSrv := context.WithCancel(ctx)
	defer stopSrv()
	gateCtx, stopGate := context.WithCancel(mgrCtx)
	gateDone := make(chan struct{})
	go func() {
		defer close(gateDone)
		gateReadiness(gateCtx, srv, ctrls.Synced(), mgr.Elected(), opts.Kube.LeaderElection, log)
	}()
	mgrErr := make(chan error, 1)
	go func() {
		err := mgr.Start(mgrCtx)
		if err != nil {
			log.Error(err, "controller manager stopped; shutting down")
		}
		// The gate must not open after this point. A manager that stopped
		// on its own lost the election; otherwise this is the SIGTERM drain.
		stopGate()
		<-gateDone
		reason := ReasonNotLeader
		if ctx.Err() != nil {
			reason = ReasonShuttingDown
		}
		srv.SetNotReady(reason)
		stopSrv()
		mgrErr <- err
	}()

	srvErr := srv.Run(srvCtx)
	stopMgr()
	err = <-mgrErr
	return errors.Join(srvErr, err)
}

// gateReadiness opens the handler gate once the controllers have synced and
// this replica is the leader (at once without leader election). A synced
// follower says not_leader, so the gateway knows to retry the leader.
func gateReadiness(ctx context.Context, srv *Server, synced, elected <-chan struct{}, election bool, log logr.Logger) {
	select {
	case <-synced:
	case <-ctx.Done():
		return
	}
	if election {
		srv.SetNotReady(ReasonNotLeader)
		log.Info("caches synced; waiting to be elected leader")
	}
	select {
	case <-elected:
	case <-ctx.Done():
		return
	}
	if ctx.Err() != nil {
		return // both were ready: stopping wins
	}
	srv.SetReady(true)
	log.Info("ready: caches synced, endpoints and policy loaded", "leader", election)
}

// restConfig resolves the API server connection as controller-runtime's
// config.GetConfig does, with an explicit --kubeconfig taking precedence.
func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := config.GetConfig()
		if err != nil {
			return nil, fmt.Errorf("find the Kubernetes API server (in-cluster, $KUBECONFIG or ~/.kube/config): %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig}, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", kubeconfig, err)
	}
	if cfg.QPS == 0 {
		cfg.QPS = -1 // as config.GetConfig: API priority and fairness limits, not the client
	}
	return cfg, nil
}

// newManager builds the controller manager: cache scoped to the pool's
// namespace, no metrics or probe server of its own (the picker serves
// both), leader election on Lease laneway-epp-<pool> when enabled.
func newManager(cfg *rest.Config, k *KubeOptions, log logr.Logger) (manager.Manager, error) {
	scheme, err := controller.NewScheme()
	if err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: scheme,
		Logger: log.WithName("manager"),
		Cache: cache.Options{
			DefaultNamespaces: map[string]cache.Config{k.PoolNamespace: {}},
			DefaultTransform:  cache.TransformStripManagedFields(),
		},
		Metrics:                       metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:        "0",
		LeaderElection:                k.LeaderElection,
		LeaderElectionID:              LeaseName(k.PoolName),
		LeaderElectionNamespace:       k.PoolNamespace,
		LeaderElectionResourceLock:    "leases",
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &k.LeaseDuration,
		RenewDeadline:                 &k.RenewDeadline,
		RetryPeriod:                   &k.RetryPeriod,
	})
	if err != nil {
		return nil, fmt.Errorf("create the controller manager for pool %s/%s: %w", k.PoolNamespace, k.PoolName, err)
	}
	return mgr, nil
}

// LeaseName is the leader-election Lease of a pool's pickers.
func LeaseName(pool string) string { return "laneway-epp-" + pool }
