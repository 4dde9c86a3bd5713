package epp

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
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
	"github.com/laneway-dev/laneway/internal/ha"
	"github.com/laneway-dev/laneway/pkg/policy"
	"github.com/laneway-dev/laneway/pkg/sched"
)

// RunKube is the endpoint picker in Kubernetes mode: endpoints from the
// pods of --pool-name, policy from the pool's PolicyClass and PolicyProfile
// objects. It is ready once the caches synced and both were handed to the
// dispatcher, unless the policy objects were invalid from the start (503
// policy_invalid until they are fixed). With leader election every ready
// replica serves: the Lease holder schedules, the others forward each
// stream to it and schedule locally while no leader is reachable
// (internal/ha). Losing the Lease demotes a leader to a follower; the
// process does not exit. It returns when ctx ends and the shutdown is
// over, or with an error when the controller manager failed.
//
// The pieces and their order: the Server serves first (an unsynced
// replica answers 503 not_ready) and runs the controller manager and,
// with leader election, the elector as its parts. The manager starts its
// caches, then, once they synced, the endpoint and policy controllers and
// the readiness gate; without leader election the status writer too. The
// elector campaigns once the controllers synced and runs the status
// writer for each term it leads. On SIGTERM the Server reports NotReady
// and the elector releases the Lease at once, both keep serving (and
// forwarding to the next leader) for --shutdown-delay; then the Server
// begins its drain and stops the manager, which stops the gate and
// controllers, then the caches, while dispatched streams finish.
//
// The servers are not the manager's own runnables: the manager would stop
// them with its other runnables and, had it the election, would release
// the Lease only once all of those returned, and exit on a lost Lease.
// It also starts them only after every informer created before Start
// synced (today there is none, but one field index at setup would keep an
// unsynced replica from even saying not_ready).
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
	srv, err := NewServer(opts, sched.FromCompiled(initial), BodyParser{}, log)
	if err != nil {
		return err
	}
	parts, identity, err := setupKube(cfg, mgr, srv, opts, log)
	if err != nil {
		srv.closeListeners()
		return err
	}
	grpcAddr, healthAddr, metricsAddr := srv.Addrs()
	log.Info("endpoint picker serving (Kubernetes mode)", "grpc", grpcAddr, "health", healthAddr, "metrics", metricsAddr, "replica", srv.ReplicaAddr(), "status", srv.StatusAddr(),
		"tls", opts.SecureServing, "pool", opts.Kube.PoolNamespace+"/"+opts.Kube.PoolName, "leaderElection", opts.Kube.LeaderElection, "identity", identity)
	return srv.Run(ctx, parts...)
}

// setupKube registers the controllers and the readiness gate with mgr and
// returns the Server's parts, and with leader election this replica's
// holder identity, with the forwarder installed on srv.
func setupKube(cfg *rest.Config, mgr manager.Manager, srv *Server, opts *Options, log logr.Logger) ([]manager.Runnable, string, error) {
	k := &opts.Kube
	accepted := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "laneway_policy_accepted",
		Help: "1 when the pool's PolicyClass and PolicyProfile objects are valid and in force, 0 when they were rejected (the last valid policy stays in force; with none ever valid the picker is not ready, reason policy_invalid).",
	})
	if err := srv.reg.Register(accepted); err != nil {
		return nil, "", fmt.Errorf("register laneway_policy_accepted: %w", err)
	}
	pool := controller.PoolRef{Group: k.PoolGroup, NamespacedName: types.NamespacedName{Namespace: k.PoolNamespace, Name: k.PoolName}}
	ctrls, err := controller.Setup(mgr, controller.Config{
		Pool:                    pool,
		DefaultMaxBatchedTokens: opts.MaxNumBatchedTokens,
		RoleLabel:               k.RoleLabel,
		StatusInterval:          k.StatusInterval,
		Dispatcher:              srv.Dispatcher(),
		Log:                     log.WithName("controller"),
		PolicyAccepted: func(ok bool) {
			if ok {
				accepted.Set(1)
			} else {
				accepted.Set(0)
			}
		},
	})
	if err != nil {
		return nil, "", err
	}
	if err := mgr.Add(&readinessGate{srv: srv, synced: ctrls.Synced(), applied: ctrls.PolicyApplied(), log: log}); err != nil {
		return nil, "", fmt.Errorf("add the readiness gate: %w", err)
	}
	parts := []manager.Runnable{&managerPart{mgr: mgr, srv: srv, log: log}}
	if !k.LeaderElection {
		if err := mgr.Add(ctrls.StatusWriter()); err != nil {
			return nil, "", fmt.Errorf("add the status writer: %w", err)
		}
		return parts, "", nil
	}

	identity := srv.Identity()
	lock, err := ha.LeaseLock(cfg, k.PoolNamespace, k.PoolName, identity, k.RenewDeadline)
	if err != nil {
		return nil, "", err
	}
	el, err := ha.NewElector(ha.ElectorConfig{
		Lock: lock, Identity: identity,
		LeaseDuration: k.LeaseDuration, RenewDeadline: k.RenewDeadline, RetryPeriod: k.RetryPeriod,
		Synced: ctrls.Synced(), Stopping: srv.Stopping(), Lead: ctrls.StatusWriter().Start,
		Registry: srv.reg, Log: log.WithName("election"),
	})
	if err != nil {
		return nil, "", fmt.Errorf("leader election: %w", err)
	}
	if err := srv.useReplicaLink(identity, el); err != nil {
		return nil, "", err
	}
	return append(parts, manager.RunnableFunc(el.Run)), identity, nil
}

// managerPart runs the controller manager as a part of the Server. The
// manager stops on its own only when it failed: the replica then answers
// not_ready while it drains, and Run returns the error so the process
// exits. Stopped by the drain, it leaves the replica answering
// shutting_down.
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
		reason = ReasonNotReady
	}
	m.srv.SetNotReady(reason)
	return err
}

// readinessGate opens the handler gate once the controllers have synced
// and a valid policy is in force. A replica whose pool's policy objects
// are invalid from the start stays not ready, answering 503
// policy_invalid, until they are fixed: serving with the synthetic default
// class instead would drop the operator's queueing, limits and shares
// without a sign (docs/troubleshooting.md). It runs on every replica: the
// manager starts it, with the controllers, once its caches synced, and
// stops it first. A gate that sees its stop late cannot reopen a draining
// Server: SetReady no longer opens then.
type readinessGate struct {
	srv             *Server
	synced, applied <-chan struct{}
	log             logr.Logger
}

var _ manager.LeaderElectionRunnable = (*readinessGate)(nil)

// NeedLeaderElection implements manager.LeaderElectionRunnable: the gate
// runs on every replica.
func (g *readinessGate) NeedLeaderElection() bool { return false }

// Start implements manager.Runnable. It returns once the gate is open, or
// when ctx ends first.
func (g *readinessGate) Start(ctx context.Context) error {
	select {
	case <-g.synced:
	case <-ctx.Done():
		return nil
	}
	select {
	case <-g.applied:
	default:
		g.srv.SetNotReady(ReasonPolicyInvalid)
		g.log.Info("caches synced, but the pool's policy objects are invalid: not ready (policy_invalid) until they are fixed")
		select {
		case <-g.applied:
		case <-ctx.Done():
			return nil
		}
	}
	if ctx.Err() != nil {
		return nil // both were ready: stopping wins
	}
	g.srv.SetReady(true)
	g.log.Info("ready: caches synced, endpoints and policy loaded")
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
// both), no leader election (the elector runs its own, to demote rather
// than exit on a lost Lease) and --drain-timeout for its runnables to stop,
// so that the whole shutdown, which the manager spends beside the Server's
// drain, fits in it.
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
		Metrics:                 metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:  "0",
		GracefulShutdownTimeout: &opts.DrainTimeout,
	})
	if err != nil {
		return nil, fmt.Errorf("create the controller manager for pool %s/%s: %w", k.PoolNamespace, k.PoolName, err)
	}
	return mgr, nil
}
