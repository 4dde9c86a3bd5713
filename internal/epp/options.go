package epp

import (
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/laneway-dev/laneway/internal/controller"
	"github.com/laneway-dev/laneway/pkg/extproc"
	"github.com/laneway-dev/laneway/pkg/policy"
)

// Default ports, shared with the upstream endpoint picker so gateway and
// chart wiring carries over.
const (
	DefaultGRPCPort       = 9002
	DefaultGRPCHealthPort = 9003
	DefaultMetricsPort    = 9090
	// DefaultReplicaPort is the replica link's port (tickets between
	// replicas, SPEC §15).
	DefaultReplicaPort = 9004
	// DefaultStatusPort is the status page's port (on loopback).
	DefaultStatusPort = 9091
)

// DefaultPprofBind is where pprof listens unless --pprof-bind says
// otherwise: the IPv4 loopback address, which every pod has (the name
// localhost would depend on the image's hosts file).
const DefaultPprofBind = "127.0.0.1"

// Options are the endpoint picker's settings. AddFlags binds them to
// flags; Complete fills derived values; Validate checks them.
type Options struct {
	// Endpoints are the standalone mode's model-server endpoints.
	Endpoints []string
	// EndpointsFile, instead of Endpoints, is a file of ip:port entries
	// (ParseEndpoints) that standalone mode rereads every
	// PolicyPollInterval: endpoints for a picker outside Kubernetes whose
	// pool changes (a service-discovery agent writes the file).
	EndpointsFile string
	// PolicyConfig is the reference-format policy YAML; empty means the
	// synthetic default class.
	PolicyConfig string
	// BindAddress is the interface the servers listen on.
	BindAddress    string
	GRPCPort       int
	GRPCHealthPort int
	MetricsPort    int
	// SecureServing serves ext_proc over TLS (self-signed unless CertPath).
	SecureServing bool
	// CertPath is a folder with tls.crt and tls.key.
	CertPath string
	// ClientCA, when set, is a PEM bundle: the ext_proc server then
	// requires every client (gateway) to present a certificate that
	// verifies against it (mutual TLS). Reloaded when the file changes.
	ClientCA string
	// ReplicaPort is the replica link's port: a replica serves it to
	// take other replicas' tickets (with leader election, or with
	// ReplicaCertPath standalone).
	ReplicaPort int
	// ReplicaCertPath is the replica identity: a folder with tls.crt,
	// tls.key and ca.crt (the CA that signs every replica of the pool).
	// The replica link is mutual TLS with it; leader election needs it.
	ReplicaCertPath string
	// ReplicaLeader, standalone, is a fixed leader's replica-link
	// address: this replica sends it its tickets (no election; for
	// benchmarks and setups without Kubernetes).
	ReplicaLeader string
	// MaxNumBatchedTokens is the default max_num_batched_tokens of an
	// endpoint, used by prefill_busy_threshold_frac.
	MaxNumBatchedTokens uint64
	// EngineType is the model servers' engine: vllm, sglang or trtllm.
	EngineType string
	// ShutdownDelay is how long the picker keeps accepting new streams
	// after SIGTERM, NotReady, so that endpoint controllers and gateways
	// stop sending before it stops accepting.
	ShutdownDelay time.Duration
	// DrainTimeout bounds how long dispatched streams may finish after
	// SIGTERM.
	DrainTimeout time.Duration
	// MaxFallbacks is how many fallback endpoints follow the pick.
	MaxFallbacks int
	// DisaggregateAboveUncachedTokens is the pool's disaggregation
	// threshold for the classes that set none: in a pool with prefill
	// pods, a request whose uncached prompt tokens are above it is
	// prefilled on a prefill pod and decoded on a decode pod.
	DisaggregateAboveUncachedTokens uint64
	// HeaderPickOnly puts only the pick in the destination header and the
	// whole list in the envoy.lb metadata: Envoy's ORIGINAL_DST cluster
	// parses the header as a single ip:port.
	HeaderPickOnly bool
	// MaxBodyBytes bounds a request body (400 beyond it).
	MaxBodyBytes int
	// MaxHeldBodyBytes bounds the request bytes held by all streams: the
	// headers of the open ones, the bodies of those not yet passed back
	// (429 held_bytes beyond it). Zero before Complete derives it: half
	// of GOMEMLIMIT when that is set, else 512 MiB, and never below
	// MaxBodyBytes.
	MaxHeldBodyBytes int64
	// MaxHeaderBytes bounds one request's header block (431 beyond it).
	MaxHeaderBytes int
	// BodyTimeout bounds the arrival of a request body after its headers
	// (408 beyond it; 0 turns it off).
	BodyTimeout time.Duration
	// MaxStreams bounds the ext_proc streams open at once, also per
	// connection (429 stream_limit beyond it; 0 turns it off).
	MaxStreams int
	// TrustClientHints takes, without an identity source, the tenant from
	// x-laneway-tenant and the class and priority hints as sent (the
	// reference router's trust in its frontend). Off, such requests are
	// all the anonymous tenant and their hints count for nothing; with an
	// identity source the bindings decide either way (SPEC §14).
	TrustClientHints bool
	// ConformanceHooks honours the upstream conformance suite's request
	// header test-epp-endpoint-selection and echoes the served endpoint
	// (SPEC §7); off, any client could pin its request to a pod past
	// taints and learn pod addresses.
	ConformanceHooks bool
	// RetryAfter is the retry-after of the 429s and 503s that have no
	// estimate of their own (SPEC §15).
	RetryAfter time.Duration
	// PolicyPollInterval is how often the policy file and the endpoints
	// file are checked for changes.
	PolicyPollInterval time.Duration
	// Verbosity is the log level (-v): 2 default, 3 verbose, 4 debug, 5 trace.
	Verbosity int
	// StatusPort serves the status page (/debug/status: tenant names and
	// endpoint addresses) on StatusBind:StatusPort; 0 lets the kernel
	// choose the port, negative turns the page off. It is not on the
	// metrics port, which listens with the other servers and which a
	// Service exposes.
	StatusPort int
	// StatusBind is the address the status page listens on: loopback
	// unless set otherwise, whatever BindAddress is (reach it with
	// kubectl port-forward).
	StatusBind string
	// PprofPort, when > 0, serves net/http/pprof on PprofBind:PprofPort.
	// Off by default: profiles expose internals and cost CPU when taken.
	PprofPort int
	// PprofBind is the address pprof listens on: loopback unless set
	// otherwise, whatever BindAddress is, so turning profiling on does not
	// open it to the pod network (reach it with kubectl port-forward).
	PprofBind string

	// Kubernetes mode (PoolName set): endpoints come from an InferencePool's
	// pods and the policy from its PolicyClass and PolicyProfile objects.
	Kube KubeOptions

	// Intel is the endpoint intelligence: metrics scraping, prefix index,
	// picker and priority forwarding (intel.go).
	Intel IntelOptions

	// Engine is EngineType parsed by Complete.
	Engine policy.Engine
}

// KubeOptions are the settings of Kubernetes mode; the zero PoolName means
// standalone mode.
type KubeOptions struct {
	// PoolName is the InferencePool whose pods are the endpoints.
	PoolName string
	// PoolNamespace is the pool's namespace; NewOptions defaults it to
	// $POD_NAMESPACE, else "default".
	PoolNamespace string
	// PoolGroup is the pool's API group.
	PoolGroup string
	// Kubeconfig is an explicit kubeconfig path; empty means controller-
	// runtime's resolution ($KUBECONFIG, in-cluster, ~/.kube/config).
	Kubeconfig string
	// LeaderElection elects one replica on a Lease to hold the pool's one
	// queue: every synced replica is ready and parses its own requests,
	// followers send the leader tickets over the replica link
	// (internal/ha) and schedule locally when none is reachable.
	LeaderElection bool
	// LeaderTLSInsecure is the flag of replicas before the replica link
	// (it skipped verifying the leader's serving certificate); it is
	// accepted and does nothing: the link is verified with the replica
	// identity.
	LeaderTLSInsecure bool
	// LeaseDuration, RenewDeadline and RetryPeriod tune the election. A
	// killed leader is replaced within about LeaseDuration.
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
	// StatusInterval bounds how often PolicyClass status.pending is
	// refreshed.
	StatusInterval time.Duration
	// RoleLabel is the pod label key of a pod's prefill/decode role.
	RoleLabel string
}

// DefaultDisaggregateAboveUncachedTokens is --disaggregate-above-uncached-tokens'
// default.
const DefaultDisaggregateAboveUncachedTokens = 256

// Kubernetes reports whether the options select Kubernetes mode.
func (o *Options) Kubernetes() bool { return o.Kube.PoolName != "" }

// ServesReplicaLink reports whether the replica serves the replica link
// (it may decide other replicas' tickets): with leader election, and
// standalone whenever it has a replica identity.
func (o *Options) ServesReplicaLink() bool {
	return o.ReplicaCertPath != "" && (o.Kube.LeaderElection || !o.Kubernetes())
}

// DefaultPoolGroup is the API group of the InferencePool v1 kind, the only
// pool kind Kubernetes mode reads.
const DefaultPoolGroup = "inference.networking.k8s.io"

// defaultPoolNamespace is the picker's own namespace (the downward API's
// POD_NAMESPACE), where its pool normally lives.
func defaultPoolNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	return "default"
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{
		BindAddress:         "",
		GRPCPort:            DefaultGRPCPort,
		GRPCHealthPort:      DefaultGRPCHealthPort,
		MetricsPort:         DefaultMetricsPort,
		ReplicaPort:         DefaultReplicaPort,
		SecureServing:       true,
		MaxNumBatchedTokens: 8192,
		EngineType:          "vllm",
		ShutdownDelay:       5 * time.Second,
		DrainTimeout:        30 * time.Second,
		// No fallbacks by default: the header then holds one ip:port, which
		// every gateway, plain Envoy's ORIGINAL_DST cluster included, can
		// route on, and header and metadata carry the same value.
		MaxFallbacks: 0,
		// Below this a decode pod prefills a prompt itself: the KV
		// transfer and the extra hop cost more than they save.
		DisaggregateAboveUncachedTokens: DefaultDisaggregateAboveUncachedTokens,
		MaxBodyBytes:                    16 << 20,
		// Standalone behind its own frontend, as the reference router;
		// the chart turns it off (trustClientHints).
		TrustClientHints:   true,
		MaxHeaderBytes:     extproc.DefaultMaxHeaderBytes,
		BodyTimeout:        extproc.DefaultBodyTimeout,
		MaxStreams:         extproc.DefaultMaxStreams,
		RetryAfter:         extproc.DefaultRetryAfter,
		PolicyPollInterval: time.Second,
		Verbosity:          2,
		PprofBind:          DefaultPprofBind,
		StatusPort:         DefaultStatusPort,
		StatusBind:         DefaultPprofBind,
		Intel:              defaultIntelOptions(),
		Kube: KubeOptions{
			PoolNamespace: defaultPoolNamespace(),
			PoolGroup:     DefaultPoolGroup,
			// Shorter than controller-runtime's 15s/10s/2s lease: a killed
			// leader costs a pool its picker for about LeaseDuration.
			LeaseDuration:  15 * time.Second,
			RenewDeadline:  10 * time.Second,
			RetryPeriod:    2 * time.Second,
			StatusInterval: 5 * time.Second,
			RoleLabel:      controller.DefaultRoleLabel,
		},
	}
}

// AddFlags binds the options to fs. The names are fixed: operators, the
// chart and the tests rely on them.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringSliceVar(&o.Endpoints, "endpoints", o.Endpoints, "Standalone mode: model-server endpoints as ip:port,...")
	fs.StringVar(&o.EndpointsFile, "endpoints-file", o.EndpointsFile, "Standalone mode: file of model-server endpoints, ip:port per line (# comments), reread when it changes; instead of --endpoints.")
	fs.StringVar(&o.PolicyConfig, "policy-config", o.PolicyConfig, "Policy YAML in the reference router's format; reloaded when it changes.")
	fs.StringVar(&o.BindAddress, "bind-address", o.BindAddress, "Address the gRPC, health and metrics servers listen on (empty: all interfaces).")
	fs.IntVar(&o.GRPCPort, "grpc-port", o.GRPCPort, "ext_proc gRPC port.")
	fs.IntVar(&o.GRPCHealthPort, "grpc-health-port", o.GRPCHealthPort, "gRPC health port (liveness, readiness).")
	fs.IntVar(&o.MetricsPort, "metrics-port", o.MetricsPort, "Prometheus metrics port.")
	fs.BoolVar(&o.SecureServing, "secure-serving", o.SecureServing, "Serve ext_proc over TLS (ALPN h2); self-signed unless --cert-path is set.")
	fs.StringVar(&o.CertPath, "cert-path", o.CertPath, "Folder holding tls.crt and tls.key for the ext_proc server; reread when they change.")
	fs.StringVar(&o.ClientCA, "client-ca", o.ClientCA, "PEM bundle of CA certificates: with it the ext_proc server requires and verifies client certificates against it (mutual TLS); reread when it changes.")
	fs.IntVar(&o.ReplicaPort, "replica-port", o.ReplicaPort, "Replica link port: other replicas send this one their tickets here when it leads (mutual TLS with --replica-cert-path; served with leader election, or standalone with --replica-cert-path).")
	fs.StringVar(&o.ReplicaCertPath, "replica-cert-path", o.ReplicaCertPath, "Folder holding the replica identity: tls.crt and tls.key, and ca.crt, the CA that signs every replica of the pool; reread when they change. The replica link is mutual TLS with it, and a stream's x-laneway-forwarded-by marker counts only from a client presenting it. Required with --ha-enable-leader-election.")
	fs.StringVar(&o.ReplicaLeader, "replica-leader", o.ReplicaLeader, "Standalone mode: send every request's ticket to the replica whose replica link is at this host:port (a fixed leader, no election; for benchmarks and setups without Kubernetes). Needs --replica-cert-path.")
	fs.Uint64Var(&o.MaxNumBatchedTokens, "max-num-batched-tokens", o.MaxNumBatchedTokens, "Default max_num_batched_tokens of a model server.")
	fs.StringVar(&o.EngineType, "engine-type", o.EngineType, "Model-server engine: vllm, sglang or trtllm.")
	fs.DurationVar(&o.ShutdownDelay, "shutdown-delay", o.ShutdownDelay, "After SIGTERM, how long the picker reports NotReady but keeps serving new streams, so that Services and gateways stop sending first (0: stop accepting at once).")
	fs.DurationVar(&o.DrainTimeout, "drain-timeout", o.DrainTimeout, "After SIGTERM and --shutdown-delay, how long dispatched streams may take to finish.")
	fs.IntVar(&o.MaxFallbacks, "max-fallbacks", o.MaxFallbacks, "Fallback endpoints returned after the pick (ordered, comma-separated).")
	fs.Uint64Var(&o.DisaggregateAboveUncachedTokens, "disaggregate-above-uncached-tokens", o.DisaggregateAboveUncachedTokens, "In a pool with prefill pods (role prefill), prefill a request on a prefill pod and decode it on a decode pod when its uncached prompt tokens are above this; a policy class's disaggregate_above_uncached_tokens overrides it.")
	fs.BoolVar(&o.HeaderPickOnly, "header-pick-only", o.HeaderPickOnly, "Put only the pick in the x-gateway-destination-endpoint header and the fallback list in the envoy.lb metadata (for plain Envoy with --max-fallbacks > 0).")
	fs.IntVar(&o.MaxBodyBytes, "max-body-bytes", o.MaxBodyBytes, "Largest request body accepted (400 beyond it).")
	fs.Int64Var(&o.MaxHeldBodyBytes, "max-held-body-bytes", o.MaxHeldBodyBytes, "Budget for the request bytes the picker holds: the headers of open streams and the body buffers of requests not yet passed back (what arrived, never what content-length announces); a request that would pass it gets 429 held_bytes (0: half of GOMEMLIMIT when set, else 512 MiB).")
	fs.IntVar(&o.MaxHeaderBytes, "max-header-bytes", o.MaxHeaderBytes, "Largest request header block (names and values) accepted (431 headers_too_large beyond it).")
	fs.DurationVar(&o.BodyTimeout, "body-timeout", o.BodyTimeout, "How long a request body may take to arrive after its headers; a body still incomplete is answered 408 body_timeout and its bytes let go (0: no limit). The queue wait is not part of it.")
	fs.IntVar(&o.MaxStreams, "max-streams", o.MaxStreams, "ext_proc streams open at once, in all and per gateway connection; one more gets 429 stream_limit (0: no limit).")
	fs.BoolVar(&o.TrustClientHints, "trust-client-hints", o.TrustClientHints, "Without an identity source in the policy: take the tenant from x-laneway-tenant and the class and priority hints (headers and body) as sent. false: every such request is the anonymous tenant and its hints are ignored (the chart's default; docs/security.md).")
	fs.BoolVar(&o.ConformanceHooks, "enable-conformance-hooks", o.ConformanceHooks, "Honour the conformance suite's test-epp-endpoint-selection request header (pins a request to the pods it names) and answer with x-conformance-test-served-endpoint. Only for conformance runs: any client could use it.")
	fs.DurationVar(&o.RetryAfter, "retry-after", o.RetryAfter, "retry-after of a 429 or 503 without a queue-wait estimate of its class (no endpoint, not ready, shutting down, a class nothing waited in lately); rounded up to whole seconds.")
	fs.DurationVar(&o.PolicyPollInterval, "policy-poll-interval", o.PolicyPollInterval, "How often --policy-config and --endpoints-file are checked for changes.")
	fs.IntVarP(&o.Verbosity, "v", "v", o.Verbosity, "Log verbosity: 2 default, 3 verbose, 4 debug, 5 trace.")
	fs.IntVar(&o.StatusPort, "status-port", o.StatusPort, "Serve the status page (/debug/status, read by laneway status) on this port of --status-bind (0: a port the kernel chooses; -1: off). It names tenants and endpoint addresses, so it is not on the metrics port.")
	fs.StringVar(&o.StatusBind, "status-bind", o.StatusBind, "Address the status page listens on (empty: all interfaces); loopback by default, whatever --bind-address is: reach it with kubectl port-forward.")
	fs.IntVar(&o.PprofPort, "pprof-port", o.PprofPort, "Serve net/http/pprof on this port (0: off).")
	fs.StringVar(&o.PprofBind, "pprof-bind", o.PprofBind, "Address pprof listens on (empty: all interfaces); loopback by default, whatever --bind-address is.")
	o.Intel.AddFlags(fs)

	k := &o.Kube
	fs.StringVar(&k.PoolName, "pool-name", k.PoolName, "Kubernetes mode: the InferencePool whose ready pods are the endpoints and whose PolicyClass objects are the policy.")
	fs.StringVar(&k.PoolNamespace, "pool-namespace", k.PoolNamespace, "Namespace of the InferencePool (default: $POD_NAMESPACE, else default).")
	fs.StringVar(&k.PoolGroup, "pool-group", k.PoolGroup, "API group of the InferencePool.")
	fs.StringVar(&k.Kubeconfig, "kubeconfig", k.Kubeconfig, "Kubeconfig file (default: $KUBECONFIG, in-cluster, then ~/.kube/config).")
	fs.BoolVar(&k.LeaderElection, "ha-enable-leader-election", k.LeaderElection, "Elect one replica on a Lease to hold the queue: every synced replica is ready and parses its own requests; followers send the leader a ticket per request over the replica link (--replica-cert-path, --replica-port), and schedule locally while no leader is reachable.")
	fs.BoolVar(&k.LeaderTLSInsecure, "leader-tls-insecure", k.LeaderTLSInsecure, "No effect: the replica link is verified with --replica-cert-path.")
	_ = fs.MarkDeprecated("leader-tls-insecure", "the replica link is verified with --replica-cert-path")
	fs.DurationVar(&k.LeaseDuration, "leader-election-lease-duration", k.LeaseDuration, "How long a follower waits before taking over a leader that stopped renewing.")
	fs.DurationVar(&k.RenewDeadline, "leader-election-renew-deadline", k.RenewDeadline, "How long the leader retries renewing before it gives up leadership.")
	fs.DurationVar(&k.RetryPeriod, "leader-election-retry-period", k.RetryPeriod, "How often candidates try to acquire or renew the Lease.")
	fs.DurationVar(&k.StatusInterval, "status-interval", k.StatusInterval, "How often PolicyClass status.pending is refreshed (written only when it changed).")
	fs.StringVar(&k.RoleLabel, "role-label", k.RoleLabel, "Kubernetes mode: the pod label giving a pod's role in a disaggregated pool: prefill, decode or prefill-decode (both, deprecated); pods without it are prefill-decode.")
}

// Complete derives values from the flags.
func (o *Options) Complete() error {
	e, err := policy.ParseEngine(o.EngineType)
	if err != nil {
		return fmt.Errorf("--engine-type: %w", err)
	}
	o.Engine = e
	var eps []string
	for _, ep := range o.Endpoints {
		if ep = strings.TrimSpace(ep); ep != "" {
			eps = append(eps, ep)
		}
	}
	o.Endpoints = eps
	limit, err := containerMemoryLimit(os.Getenv)
	if err != nil {
		return err
	}
	if limit > 0 {
		debug.SetMemoryLimit(limit)
	}
	if o.MaxHeldBodyBytes == 0 {
		o.MaxHeldBodyBytes = defaultHeldBodyBytes(debug.SetMemoryLimit(-1), o.MaxBodyBytes)
	}
	return nil
}

// MemoryLimitEnv names the variable that carries the container's memory
// limit in bytes (the chart sets it from the downward API's limits.memory).
const MemoryLimitEnv = "LANEWAY_MEMORY_LIMIT_BYTES"

// containerMemoryLimit is the Go memory limit to set for the container
// limit in MemoryLimitEnv: 90% of it, leaving a tenth for what the Go
// runtime does not count against its limit (the binary's text and data,
// freed pages not yet returned) before the kernel's OOM killer counts it.
// 0 leaves the runtime's limit alone: no container limit given, or
// GOMEMLIMIT set, which says what the operator wants.
func containerMemoryLimit(getenv func(string) string) (int64, error) {
	v := getenv(MemoryLimitEnv)
	if v == "" || getenv("GOMEMLIMIT") != "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s=%q: want the container's memory limit in bytes, a positive integer", MemoryLimitEnv, v)
	}
	return n / 10 * 9, nil
}

// defaultHeldBodyBytes is --max-held-body-bytes' default for a Go memory
// limit (math.MaxInt64 when GOMEMLIMIT is unset): half of it, leaving the
// other half to everything else the picker holds and to the garbage the
// collector has not freed yet, else extproc's 512 MiB; never below one
// body of maxBody, which could otherwise never be admitted.
func defaultHeldBodyBytes(memLimit int64, maxBody int) int64 {
	n := int64(extproc.DefaultMaxHeldBodyBytes)
	if memLimit > 0 && memLimit < math.MaxInt64 {
		n = memLimit / 2
	}
	return max(n, int64(maxBody))
}

// Validate checks the options.
func (o *Options) Validate() error {
	var errs []error
	for _, ep := range o.Endpoints {
		if err := checkEndpoint(ep); err != nil {
			errs = append(errs, fmt.Errorf("--endpoints: %q is not ip:port: %w", ep, err))
		}
	}
	for name, p := range map[string]int{"--grpc-port": o.GRPCPort, "--grpc-health-port": o.GRPCHealthPort, "--metrics-port": o.MetricsPort, "--pprof-port": o.PprofPort, "--replica-port": o.ReplicaPort} {
		if p < 0 || p > 65535 {
			errs = append(errs, fmt.Errorf("%s: %d is not a port", name, p))
		}
	}
	if o.StatusPort < -1 || o.StatusPort > 65535 {
		errs = append(errs, fmt.Errorf("--status-port: %d is not a port (or -1: off)", o.StatusPort))
	}
	if o.EndpointsFile != "" && len(o.Endpoints) > 0 {
		errs = append(errs, errors.New("--endpoints and --endpoints-file exclude each other"))
	}
	if (o.EndpointsFile != "" || o.PolicyConfig != "") && o.PolicyPollInterval <= 0 {
		errs = append(errs, fmt.Errorf("--policy-poll-interval: %s must be positive", o.PolicyPollInterval))
	}
	if o.EndpointsFile != "" && o.Kubernetes() {
		errs = append(errs, errors.New("--endpoints-file and --pool-name exclude each other: endpoints come from the pool's pods in Kubernetes mode"))
	}
	if o.ClientCA != "" && !o.SecureServing {
		errs = append(errs, fmt.Errorf("--client-ca %s needs --secure-serving: client certificates are part of TLS", o.ClientCA))
	}
	if o.Kube.LeaderElection && o.ReplicaCertPath == "" {
		errs = append(errs, errors.New("--ha-enable-leader-election needs --replica-cert-path: the replicas send their leader tickets over mutual TLS with the replica identity (the chart provisions it)"))
	}
	if o.ReplicaLeader != "" {
		if o.Kubernetes() {
			errs = append(errs, errors.New("--replica-leader is for standalone mode: in Kubernetes mode the leader is elected (--ha-enable-leader-election)"))
		}
		if o.ReplicaCertPath == "" {
			errs = append(errs, errors.New("--replica-leader needs --replica-cert-path: the replica link is mutual TLS with the replica identity"))
		}
		if _, _, err := net.SplitHostPort(o.ReplicaLeader); err != nil {
			errs = append(errs, fmt.Errorf("--replica-leader: %q is not host:port: %w", o.ReplicaLeader, err))
		}
	}
	if o.MaxFallbacks < 0 {
		errs = append(errs, fmt.Errorf("--max-fallbacks: %d is negative", o.MaxFallbacks))
	}
	if o.MaxBodyBytes <= 0 {
		errs = append(errs, fmt.Errorf("--max-body-bytes: %d must be positive", o.MaxBodyBytes))
	}
	if o.MaxHeaderBytes <= 0 {
		errs = append(errs, fmt.Errorf("--max-header-bytes: %d must be positive", o.MaxHeaderBytes))
	}
	if o.BodyTimeout < 0 {
		errs = append(errs, fmt.Errorf("--body-timeout: %s is negative", o.BodyTimeout))
	}
	if o.MaxStreams < 0 || o.MaxStreams > math.MaxUint32 {
		errs = append(errs, fmt.Errorf("--max-streams: %d is not between 0 and %d", o.MaxStreams, uint32(math.MaxUint32)))
	}
	// 0 is the flag's "derive it" (Complete does); only a set value can
	// be too small.
	if o.MaxHeldBodyBytes != 0 && o.MaxHeldBodyBytes < int64(o.MaxBodyBytes) {
		errs = append(errs, fmt.Errorf("--max-held-body-bytes: %d is below --max-body-bytes (%d): a body between them could never be admitted", o.MaxHeldBodyBytes, o.MaxBodyBytes))
	}
	if o.RetryAfter <= 0 {
		errs = append(errs, fmt.Errorf("--retry-after: %s must be positive", o.RetryAfter))
	}
	if o.DrainTimeout < 0 {
		errs = append(errs, fmt.Errorf("--drain-timeout: %s is negative", o.DrainTimeout))
	}
	if o.ShutdownDelay < 0 {
		errs = append(errs, fmt.Errorf("--shutdown-delay: %s is negative", o.ShutdownDelay))
	}
	errs = append(errs, o.validateKube()...)
	errs = append(errs, o.Intel.validate()...)
	return errors.Join(errs...)
}

// validateKube checks the Kubernetes-mode options; they are ignored in
// standalone mode, but a standalone source combined with --pool-name is a
// mistake worth refusing: it would silently pick one of the two.
func (o *Options) validateKube() []error {
	k := &o.Kube
	if k.PoolName == "" {
		return nil
	}
	var errs []error
	if len(o.Endpoints) > 0 {
		errs = append(errs, errors.New("--endpoints and --pool-name exclude each other: endpoints come from the pool's pods in Kubernetes mode"))
	}
	if o.PolicyConfig != "" {
		errs = append(errs, errors.New("--policy-config and --pool-name exclude each other: the policy comes from the pool's PolicyClass objects in Kubernetes mode"))
	}
	for _, f := range []struct{ flag, v string }{{"--pool-name", k.PoolName}, {"--pool-namespace", k.PoolNamespace}} {
		if msgs := validation.IsDNS1123Subdomain(f.v); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("%s: %q is not a valid name: %s", f.flag, f.v, strings.Join(msgs, "; ")))
		}
	}
	if k.PoolGroup != DefaultPoolGroup {
		errs = append(errs, fmt.Errorf("--pool-group: %q is not supported; only %s (InferencePool v1) is", k.PoolGroup, DefaultPoolGroup))
	}
	if msgs := validation.IsQualifiedName(k.RoleLabel); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--role-label: %q is not a valid label key: %s", k.RoleLabel, strings.Join(msgs, "; ")))
	}
	if k.StatusInterval <= 0 {
		errs = append(errs, fmt.Errorf("--status-interval: %s must be positive", k.StatusInterval))
	}
	if k.LeaderElection {
		// client-go's leader elector refuses other orders at start (its
		// retries jitter by up to 1.2×); saying so here names the flags.
		if k.RetryPeriod <= 0 || float64(k.RenewDeadline) <= 1.2*float64(k.RetryPeriod) || k.LeaseDuration <= k.RenewDeadline {
			errs = append(errs, fmt.Errorf("leader election needs 0 < 1.2 × --leader-election-retry-period (%s) < --leader-election-renew-deadline (%s) < --leader-election-lease-duration (%s)",
				k.RetryPeriod, k.RenewDeadline, k.LeaseDuration))
		}
	}
	return errs
}
