package epp

import (
	"context"
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
//
// The pieces and their order: the Server serves first (an unsynced
// replica answers 503 not_ready) and runs the controller manager as its
// part. The manager starts its caches, then, once they synced, the
// endpoint and policy controllers and the readiness gate (every replica),
// and once elected the status writer (the Lease holder only). On SIGTERM
// the Server begins its drain and stops the manager, which stops the gate
// and controllers, then the status writer, then the caches, and releases
// the Lease, while dispatched streams finish.
//
// The servers are not the manager's own runnables: controller-runtime
// releases the Lease only once all of those returned (a follower would
// wait out the drain), on lost leadership returns without waiting for them
// (the drain would be cut short), and starts them only after every
// informer created before Start synced (today there is none, but one
// field index at setup would keep an unsynced replica from even saying
// not_ready).
func RunKube(ctx context.Context, opts *Options, log logr.Logger) error {
	// client-go (leader election) logs through klog and controller-runtime
	// through its own global; both go to the picker's logger.
	klog.SetLogger(log.WithName("client-go"))
	ctrl.SetLogger(log)

	cfg, err := restConfig(opts.Kube.Kubeconfig)
	if err != nil {
		return err
	}
	mgr, err := newManager(cfg, opts, log)
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
	if err == nil {
		err = mgr.Add(&readinessGate{srv: srv, synced: ctrls.Synced(), elected: mgr.Elected(), election: opts.Kube.LeaderElection, log: log})
	}
	if err != nil {
		srv.closeListeners()
		return err
	}
	grpcAddr, healthAddr, metricsAddr := srv.Addrs()
	log.Info("endpoint picker serving (Kubernetes mode)", "grpc", grpcAddr, "health", healthAddr, "metrics", metricsAddr,
		"tls", opts.SecureServing, "pool", pool.String(), "leaderElection", opts.Kube.LeaderElection)
	return srv.Run(ctx, &managerPart{mgr: mgr, srv: srv, log: log})
}

// managerPart runs the controller manager as a part of the Server. The
// manager stops on its own only when leadership is lost (or it failed):
// the replica then answers not_leader while it drains, and Run returns
// the error so the process exits and restarts as a follower. Stopped by
// the drain, it leaves the replica answering shutting_down.
type managerPart struct {
	mgr manager.Manager
	srv *Server
	log logr.Logger
}

// Start implements manager.Runnable.
func (m *managerPart) Start(ctx context.Context) error {
	err := m.mgr.Start(ctx)
	if err != nil {
		m.log.Error(err, "controller manager stopped; shutting down")
	}
	reason := ReasonShuttingDown
	if ctx.Err() == nil {
		reason = ReasonNotLeader
	}
	m.srv.SetNotReady(reason)
	return err
}

// readinessGate opens the handler gate once the controllers have synced and
// this replica is the leader (at once without leader election). A synced
// follower says not_leader, so the gateway knows to retry the leader. It
// runs on every replica: the manager starts it, with the controllers, once
// its caches synced, and stops it first. A gate that sees its stop late
// (the manager does not wait for it once leadership is lost) cannot reopen
// a draining Server: SetReady no longer opens then.
type readinessGate struct {
	srv             *Server
	synced, elected <-chan struct{}
	election        bool
	log             logr.Logger
}

var _ manager.LeaderElectionRunnable = (*readinessGate)(nil)

// NeedLeaderElection implements manager.LeaderElectionRunnable: the gate
// runs on followers too, to say not_leader.
func (g *readinessGate) NeedLeaderElection() bool { return false }

// Start implements manager.Runnable. It returns once the gate is open, or
// when ctx ends first.
func (g *readinessGate) Start(ctx context.Context) error {
	select {
	case <-g.synced:
	case <-ctx.Done():
		return nil
	}
	if g.election {
		g.srv.SetNotReady(ReasonNotLeader)
		g.log.Info("caches synced; waiting to be elected leader")
	}
	select {
	case <-g.elected:
	case <-ctx.Done():
		return nil
	}
	if ctx.Err() != nil {
		return nil // both were ready: stopping wins
	}
	g.srv.SetReady(true)
	g.log.Info("ready: caches synced, endpoints and policy loaded", "leader", g.election)
	return nil
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
// both), leader election on Lease laneway-epp-<pool> when enabled, and
// --drain-timeout for its runnables to stop, so that the whole shutdown,
// which the manager spends beside the Server's drain, fits in it.
func newManager(cfg *rest.Config, opts *Options, log logr.Logger) (manager.Manager, error) {
	k := &opts.Kube
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
		GracefulShutdownTimeout:       &opts.DrainTimeout,
	})
	if err != nil {
		return nil, fmt.Errorf("create the controller manager for pool %s/%s: %w", k.PoolNamespace, k.PoolName, err)
	}
	return mgr, nil
}

// LeaseName is the leader-election Lease of a pool's pickers.
func LeaseName(pool string) string { return "laneway-epp-" + pool }
