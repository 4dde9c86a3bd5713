package epp

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/laneway-dev/laneway/internal/dispatcher"
	"github.com/laneway-dev/laneway/internal/ha"
	"github.com/laneway-dev/laneway/pkg/policy"
	"github.com/laneway-dev/laneway/pkg/sched"
)

// LoadPolicy reads and compiles the policy file; an empty path is the
// synthetic default class (SPEC §2).
func LoadPolicy(path string) (*policy.Compiled, error) {
	cfg := &policy.Config{}
	if path != "" {
		var err error
		if cfg, err = policy.LoadFile(path); err != nil {
			return nil, err
		}
	}
	return cfg.Compile()
}

// Run is the standalone endpoint picker: endpoints from --endpoints or
// --endpoints-file, policy from --policy-config (both files reloaded when
// they change). It returns when
// ctx ends and the drain is over.
func Run(ctx context.Context, opts *Options, log logr.Logger) error {
	compiled, err := LoadPolicy(opts.PolicyConfig)
	if err != nil {
		return err
	}
	srv, err := NewServer(opts, sched.FromCompiled(compiled), BodyParser{}, log)
	if err != nil {
		return err
	}
	eps, epsFile, err := standaloneEndpoints(opts, log)
	if err != nil {
		return err
	}
	srv.Dispatcher().SetEndpoints(eps)
	identity := srv.Identity()
	if opts.ReplicaCertPath != "" {
		var view ha.LeaderView
		if opts.ReplicaLeader != "" {
			view = ha.StaticLeader(opts.ReplicaLeader)
		}
		if err := srv.useReplicaLink(identity, view); err != nil {
			srv.closeListeners()
			return err
		}
	}
	grpcAddr, healthAddr, metricsAddr := srv.Addrs()
	log.Info("endpoint picker serving", "grpc", grpcAddr, "health", healthAddr, "metrics", metricsAddr, "replica", srv.ReplicaAddr(), "status", srv.StatusAddr(),
		"tls", opts.SecureServing, "endpoints", len(eps), "classes", len(compiled.Classes), "identity", identity, "replicaLeader", opts.ReplicaLeader)
	logClasses(log, compiled)
	log.Info("tenants: " + identityLine(compiled.Identity(), opts.TrustClientHints))
	srv.SetReady(true)
	var parts []manager.Runnable
	if opts.PolicyConfig != "" {
		parts = append(parts, manager.RunnableFunc(func(ctx context.Context) error {
			watchPolicy(ctx, opts.PolicyConfig, opts.PolicyPollInterval, srv.Dispatcher(), log)
			return nil
		}))
	}
	if opts.EndpointsFile != "" {
		parts = append(parts, manager.RunnableFunc(func(ctx context.Context) error {
			watchEndpoints(ctx, opts, epsFile, srv.Dispatcher(), log)
			return nil
		}))
	}
	return srv.Run(ctx, parts...)
}

// identityLine says in one line where tenants come from, with
// --trust-client-hints.
func identityLine(id *policy.Identity, trust bool) string {
	if id == nil && !trust {
		return `no identity configured and --trust-client-hints=false: every request is tenant "` + policy.DefaultAnonymousTenant + `" and client hints are ignored`
	}
	return id.String()
}

func logClasses(log logr.Logger, c *policy.Compiled) {
	for i, cl := range c.Classes {
		log.V(2).Info("policy class", "class", cl.Name, "quantum", cl.Quantum, "policy", cl.Policy.String(),
			"busy", c.Busy[i].String(), "queueing", cl.Queueing)
	}
}

// watchPolicy polls the policy file and swaps in each valid new version. A
// file that fails to load is logged once per content and ignored: the last
// good policy stays in force. Polling (not inotify) also sees the symlink
// swap a Kubernetes ConfigMap volume does.
func watchPolicy(ctx context.Context, path string, every time.Duration, d *dispatcher.Dispatcher, log logr.Logger) {
	last, _ := os.ReadFile(path)
	pollFile(ctx, path, last, every, func([]byte) {
		if err := reloadPolicy(path, d); err != nil {
			log.Error(err, "policy file rejected; the previous policy stays in force", "path", path)
			return
		}
		log.Info("policy reloaded", "path", path)
	})
}

func reloadPolicy(path string, d *dispatcher.Dispatcher) error {
	c, err := LoadPolicy(path)
	if err != nil {
		return err
	}
	if err := d.SetPolicy(sched.FromCompiled(c)); err != nil {
		return fmt.Errorf("apply policy: %w", err)
	}
	return nil
}

// StaticEndpoints is the endpoint set of --endpoints: each address with
// the default max_num_batched_tokens, and as its data-parallel rank its
// position among the listed ports of its host (SPEC §5: a host's ports
// are its ranks, in the order given).
func StaticEndpoints(addrs []string, maxBatched uint64) []sched.Endpoint {
	eps := make([]sched.Endpoint, 0, len(addrs))
	ranks := map[string]int{}
	for _, a := range addrs {
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			host = a // Validate has refused it already; keep the old behaviour
		}
		eps = append(eps, sched.Endpoint{Addr: a, MaxBatchedTokens: maxBatched, Rank: ranks[host]})
		ranks[host]++
	}
	return eps
}
