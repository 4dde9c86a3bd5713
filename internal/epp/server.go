package epp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/laneway-dev/laneway/internal/dispatcher"
	"github.com/laneway-dev/laneway/internal/ha"
	"github.com/laneway-dev/laneway/internal/metrics"
	"github.com/laneway-dev/laneway/internal/status"
	"github.com/laneway-dev/laneway/internal/tlsutil"
	"github.com/laneway-dev/laneway/pkg/extproc"
	"github.com/laneway-dev/laneway/pkg/replica"
	"github.com/laneway-dev/laneway/pkg/sched"
)

// Health service names (SPEC §7). The ext_proc service name is what Envoy's
// gRPC health check asks for; inference-extension is what the upstream
// conformance manifests probe.
const (
	HealthLiveness  = "liveness"
	HealthReadiness = "readiness"
	HealthInference = "inference-extension"
)

// Server is a running endpoint picker: the ext_proc gRPC server, the health
// server, the metrics server and the status page's (on --status-bind,
// loopback by default; at most MaxConcurrentScrapes requests at once
// between them), the pprof server when --pprof-port asks for it (on
// --pprof-bind, loopback by default), and the dispatcher loop. Run serves them, runs
// the picker's other parts beside them and drains them in order.
type Server struct {
	opts    *Options
	log     logr.Logger
	disp    *dispatcher.Dispatcher
	health  *health.Server
	metrics *metrics.Metrics
	status  *status.Tracker // the status page's window
	reg     *prometheus.Registry
	intel   *intel
	// ext is the ext_proc stream handler; route, registered on grpcSrv,
	// hands it each stream (honouring a peer replica's forwarded marker).
	ext     *extproc.Server
	route   *ha.Router
	handler *Handler
	// tlsCfg is the ext_proc server's TLS config (nil for plaintext).
	tlsCfg *tls.Config
	// The replica link (SPEC §15; nil without one): the replica identity,
	// the link's server (replicaSrv on replicaLn, deciding other
	// replicas' tickets), and tickets, the handler's scheduler in front
	// of the dispatcher on a replica that may follow a leader.
	peers      *ha.PeerTLS
	replicaLn  net.Listener
	replicaSrv *grpc.Server
	tickets    *ha.Tickets

	grpcLn, healthLn, metricsLn net.Listener
	grpcSrv, healthSrv          *grpc.Server
	metricsSrv                  *http.Server
	// statusLn and statusSrv are nil with --status-port=-1.
	statusLn  net.Listener
	statusSrv *http.Server
	// pprofLn and pprofSrv are nil unless --pprof-port is set.
	pprofLn  net.Listener
	pprofSrv *http.Server

	// mu orders the readiness changes. ready is what readiness reports
	// before the drain flips it; draining is set once the drain began,
	// after which SetReady no longer opens anything (a readiness gate that
	// has not yet seen its stop signal must not undo the drain).
	mu       sync.Mutex
	ready    bool
	draining bool
	// notServing is the handler gate's reason ("" = serving); it follows
	// ready, and SetNotReady names why.
	notServing atomic.Pointer[string]
	// stopping is closed when the stop signal came (the start of the
	// shutdown delay): the elector releases the Lease then.
	stopping chan struct{}
}

// Reasons a replica that is not ready gives its 503 answers.
const (
	ReasonNotReady     = "not_ready"
	ReasonShuttingDown = "shutting_down"
	// ReasonPolicyInvalid: Kubernetes mode found the pool's policy objects
	// invalid and has never had a valid set to apply (docs/troubleshooting.md
	// says why the replica does not serve with the default class instead).
	ReasonPolicyInvalid = "policy_invalid"
)

// NewServer builds the picker from options and a compiled policy, and
// binds its listeners (so the ports are known before Run).
func NewServer(opts *Options, pol *sched.Policy, parser RequestParser, log logr.Logger) (*Server, error) {
	s := &Server{opts: opts, log: log, reg: prometheus.NewRegistry(), stopping: make(chan struct{})}
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.metrics = metrics.New(s.reg, "")
	s.status = status.NewTracker()
	dopts := dispatcher.Options{Observers: []dispatcher.Observer{s.metrics, s.status}}
	dopts.MaxFallbacks = opts.MaxFallbacks
	dopts.DisaggregateAboveUncachedTokens = opts.DisaggregateAboveUncachedTokens
	s.intel = newIntel(opts, log)
	s.intel.configure(&dopts)
	d, err := dispatcher.New(pol, dopts)
	if err != nil {
		return nil, err
	}
	s.disp = d
	s.metrics.SetSource(d)
	if err := s.intel.attach(d, s.reg); err != nil {
		return nil, err
	}

	var creds []grpc.ServerOption
	if opts.SecureServing {
		cfg, err := serverTLS(opts, log)
		if err != nil {
			return nil, err
		}
		creds = append(creds, grpc.Creds(credentials.NewTLS(cfg)))
		s.tlsCfg = cfg
	}
	creds = append(creds, grpc.MaxRecvMsgSize(opts.MaxBodyBytes+(1<<20)))
	if opts.MaxStreams > 0 {
		// Per connection as well as in all: HTTP/2 refuses a stream past
		// it before a goroutine is spent on it, and a gateway opens
		// another connection instead.
		creds = append(creds, grpc.MaxConcurrentStreams(uint32(opts.MaxStreams)))
	}
	creds = append(creds, TransportOptions()...)
	s.grpcSrv = grpc.NewServer(creds...)
	notReady := ReasonNotReady
	s.notServing.Store(&notReady) // health is set up below
	h := &Handler{Parser: parser, Dispatcher: d, Gate: s.gate, Hooks: s.intel, Identity: d.Identity, IgnoreClientHints: !opts.TrustClientHints,
		WaitEstimate: cachedEstimate(func(class string) time.Duration { return s.status.Class(class).WaitP50 }, time.Second, time.Now)}
	s.handler = h
	s.ext = extproc.NewServer(h, extproc.Options{
		MaxBodyBytes: opts.MaxBodyBytes,
		// MaxHeldBodyBytes is set by Complete; tests that skip it get
		// extproc's default.
		MaxHeldBodyBytes: opts.MaxHeldBodyBytes,
		MaxHeaderBytes:   opts.MaxHeaderBytes,
		BodyTimeout:      offIfZero(opts.BodyTimeout),
		MaxStreams:       offIfZero(opts.MaxStreams),
		Logger:           log.WithName("extproc"),
		Observer:         s.metrics,
		HeaderPickOnly:   opts.HeaderPickOnly,

		ConformanceHooks: opts.ConformanceHooks,
		RetryAfter:       opts.RetryAfter,
	})
	s.route = ha.NewRouter(s.ext)
	extprocv3.RegisterExternalProcessorServer(s.grpcSrv, s.route)
	if opts.ReplicaCertPath != "" {
		peers, err := ha.LoadPeerTLS(opts.ReplicaCertPath, log.WithName("replica"))
		if err != nil {
			return nil, err
		}
		s.peers = peers
		s.route.TrustPeers(peers)
		if opts.ServesReplicaLink() {
			s.replicaSrv = grpc.NewServer(peers.ServerOptions()...)
		}
	}
	metrics.RegisterHeldBytes(s.reg, s.ext)

	s.health = health.NewServer()
	s.healthSrv = grpc.NewServer()
	healthpb.RegisterHealthServer(s.healthSrv, s.health)
	// The ext_proc port answers health checks too: Envoy's gRPC health
	// check of the ext_proc cluster goes to the port it sends streams to.
	healthpb.RegisterHealthServer(s.grpcSrv, s.health)
	s.setServing(false)
	s.health.SetServingStatus(HealthLiveness, healthpb.HealthCheckResponse_SERVING)

	// One bound for the metrics page and the status page together, each on
	// its own listener: the status page names tenants and endpoint
	// addresses, so it is not on the metrics port, which listens with the
	// other servers and which a Service exposes (SPEC §15).
	pages := http.NewServeMux()
	pages.Handle("/metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	pages.Handle(status.Path, status.Handler(d, s.status))
	bounded := boundScrapes(pages, MaxConcurrentScrapes)
	s.reg.MustRegister(status.Collector{T: s.status})
	serveOnly := func(path string) http.Handler {
		mux := http.NewServeMux()
		mux.Handle(path, bounded)
		return mux
	}
	// IdleTimeout closes keep-alive connections no scraper reuses: the
	// scrape bound counts requests, not connections.
	s.metricsSrv = &http.Server{Handler: serveOnly("/metrics"), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 5 * time.Minute}

	type listener struct {
		flag string
		host string
		port int
		ln   *net.Listener
	}
	listeners := []listener{
		{"--grpc-port", opts.BindAddress, opts.GRPCPort, &s.grpcLn},
		{"--grpc-health-port", opts.BindAddress, opts.GRPCHealthPort, &s.healthLn},
		{"--metrics-port", opts.BindAddress, opts.MetricsPort, &s.metricsLn},
	}
	if s.replicaSrv != nil {
		listeners = append(listeners, listener{"--replica-port", opts.BindAddress, opts.ReplicaPort, &s.replicaLn})
	}
	if opts.StatusPort >= 0 {
		s.statusSrv = &http.Server{Handler: serveOnly(status.Path), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 5 * time.Minute}
		listeners = append(listeners, listener{"--status-port", opts.StatusBind, opts.StatusPort, &s.statusLn})
	}
	if opts.PprofPort > 0 {
		s.pprofSrv = pprofServer()
		listeners = append(listeners, listener{"--pprof-port", opts.PprofBind, opts.PprofPort, &s.pprofLn})
	}
	for _, l := range listeners {
		ln, err := net.Listen("tcp", net.JoinHostPort(l.host, strconv.Itoa(l.port)))
		if err != nil {
			s.closeListeners()
			return nil, fmt.Errorf("%s: listen on %s: %w", l.flag, net.JoinHostPort(l.host, strconv.Itoa(l.port)), err)
		}
		*l.ln = ln
	}
	return s, nil
}

// offIfZero maps a flag's 0 ("no limit") to extproc's -1 (off), whose 0
// means its default.
func offIfZero[T ~int | ~int64](v T) T {
	if v == 0 {
		return -1
	}
	return v
}

// closeListeners releases the ports of a server that will not run.
func (s *Server) closeListeners() {
	for _, ln := range []net.Listener{s.grpcLn, s.healthLn, s.metricsLn, s.statusLn, s.pprofLn, s.replicaLn} {
		if ln != nil {
			ln.Close()
		}
	}
}

// Dispatcher returns the picker's dispatcher (for endpoint and policy
// updates).
func (s *Server) Dispatcher() *dispatcher.Dispatcher { return s.disp }

// Identity is this replica's holder identity on the replica link
// (ha.Identity of the link's bound address), "" when it serves none.
func (s *Server) Identity() string {
	if s.replicaLn == nil {
		return ""
	}
	return ha.Identity(s.replicaLn.Addr())
}

// useReplicaLink wires the replica link with this replica's holder
// identity: the link's server, which decides other replicas' tickets in
// this replica's dispatcher (when it serves the link), and, when view
// says who leads, the handler's scheduler becomes ha.Tickets, which sends
// the leader a ticket per request and decides here while this replica
// leads or no leader is reachable. Call it before Run.
func (s *Server) useReplicaLink(identity string, view ha.LeaderView) error {
	if s.replicaSrv != nil {
		ts, err := ha.NewTicketServer(ha.TicketServerConfig{Scheduler: s.disp, Self: identity, Gate: s.gate,
			Answer: s.handler.replyFor, Registry: s.reg, Log: s.log.WithName("replica")})
		if err != nil {
			return err
		}
		replica.Register(s.replicaSrv, ts)
	}
	if view == nil {
		return nil
	}
	t, err := ha.NewTickets(ha.TicketsConfig{Leader: view, Self: identity, Local: s.disp, TLS: s.peers,
		Registry: s.reg, Log: s.log.WithName("tickets")})
	if err != nil {
		return err
	}
	s.tickets = t
	s.handler.Dispatcher = t
	return nil
}

// ReplicaAddr is the replica link's bound address, "" when it serves
// none.
func (s *Server) ReplicaAddr() string {
	if s.replicaLn == nil {
		return ""
	}
	return s.replicaLn.Addr().String()
}

// Addrs returns the bound ext_proc, health and metrics addresses.
func (s *Server) Addrs() (grpcAddr, healthAddr, metricsAddr string) {
	return s.grpcLn.Addr().String(), s.healthLn.Addr().String(), s.metricsLn.Addr().String()
}

// StatusAddr returns the status page's bound address, "" when it is off.
func (s *Server) StatusAddr() string {
	if s.statusLn == nil {
		return ""
	}
	return s.statusLn.Addr().String()
}

// SetReady sets readiness (for example from leader election). A server
// that is not ready still answers streams, with 503, so a gateway that
// reaches it anyway retries elsewhere. Once the drain has begun SetReady
// does not make the server ready again.
func (s *Server) SetReady(ready bool) {
	if !ready {
		s.SetNotReady(ReasonNotReady)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining {
		return
	}
	s.notServing.Store(new(string))
	s.ready = true
	s.setServing(true)
}

// SetNotReady makes readiness NOT_SERVING and answers new streams 503 with
// reason (for example ReasonNotReady before the caches synced).
func (s *Server) SetNotReady(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notServing.Store(&reason)
	s.ready = false
	s.setServing(false)
}

// gate is the handler's readiness gate.
func (s *Server) gate() string { return *s.notServing.Load() }

func (s *Server) setServing(ok bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range []string{HealthReadiness, HealthInference, extproc.ServiceName, ""} {
		s.health.SetServingStatus(name, st)
	}
}

// Run serves until ctx ends, then shuts down. parts are the picker's other
// long-running pieces: the controller manager and the elector in
// Kubernetes mode, the policy file watcher standalone. They start once the
// servers serve, so a replica answers (503 until it is ready) from its
// first moment, and are told to stop when the drain begins. The server or
// a part stopping on its own (a part returns before ctx ends, as the
// manager does when it fails) begins the drain at once, and Run returns
// its error.
//
// The shutdown (SPEC §15), when ctx ends:
//
//  1. Readiness goes NOT_SERVING and SetReady no longer opens it; Stopping
//     closes, so the elector releases the Lease and the next leader takes
//     over; liveness stays SERVING and new streams are still served, for
//     --shutdown-delay, the time Services and gateways take to stop
//     sending here.
//  2. The drain: liveness goes NOT_SERVING, the parts are told to stop,
//     the listener closes (a new connection is refused), queued requests
//     are answered 503 shutting_down and dispatched streams get
//     DrainTimeout to finish. Then Run waits for the parts, closes the
//     health, metrics and pprof servers and stops the dispatcher loop
//     last, so nothing a part still sends it goes to a stopped loop.
func (s *Server) Run(ctx context.Context, parts ...manager.Runnable) error {
	loopCtx, stopLoop := context.WithCancel(context.Background())
	loopDone := make(chan struct{})
	go func() { s.disp.Run(loopCtx); close(loopDone) }()

	servers := s.serve()
	s.mu.Lock()
	s.setServing(s.ready)
	s.mu.Unlock()

	// The parts outlive the stop signal: the manager keeps the endpoints
	// current through the shutdown delay, and the elector follows the
	// Lease; the drain stops them.
	partsCtx, stopParts := context.WithCancel(context.WithoutCancel(ctx))
	defer stopParts()
	partErrs := make(chan error, len(parts))
	for _, p := range parts {
		go func() { partErrs <- p.Start(partsCtx) }()
	}

	var errs []error
	running := len(parts)
	cause := "stop signal"
	select {
	case <-ctx.Done():
	case err := <-servers:
		s.log.Error(err, "server stopped")
		errs = append(errs, err)
		cause = "server stopped"
	case err := <-partErrs: // the part logs its own failure
		running--
		errs = append(errs, err)
		cause = "part stopped"
	}

	s.mu.Lock()
	s.draining = true
	s.setServing(false)
	s.mu.Unlock()
	close(s.stopping)
	if d := s.opts.ShutdownDelay; cause == "stop signal" && d > 0 {
		s.log.Info("shutting down: not ready, still serving new streams for the shutdown delay", "delay", d)
		select {
		case <-time.After(d):
		case err := <-servers:
			s.log.Error(err, "server stopped")
			errs = append(errs, err)
		}
	}

	s.log.Info("stopped accepting; draining", "timeout", s.opts.DrainTimeout, "cause", cause)
	s.health.SetServingStatus(HealthLiveness, healthpb.HealthCheckResponse_NOT_SERVING)
	stopParts()
	s.disp.Shutdown() // queued tickets too: their followers offer them elsewhere
	if s.replicaSrv != nil {
		// The followers' links end: nothing of theirs is queued here any
		// more, and their grants no longer count once this replica stops
		// deciding.
		s.replicaSrv.Stop()
	}
	stopped := make(chan struct{})
	go func() { s.grpcSrv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(s.opts.DrainTimeout):
		s.log.Info("drain timeout reached; closing remaining streams")
		s.grpcSrv.Stop()
		<-stopped
	}
	if s.tickets != nil {
		s.tickets.Close() // the streams are over: no ticket waits any more
	}
	for ; running > 0; running-- {
		errs = append(errs, <-partErrs)
	}
	s.healthSrv.Stop()
	shutCtx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = s.metricsSrv.Shutdown(shutCtx)
	if s.statusSrv != nil {
		_ = s.statusSrv.Shutdown(shutCtx)
	}
	if s.pprofSrv != nil {
		_ = s.pprofSrv.Close() // profiles in progress are not worth waiting for
	}
	s.intel.stop()
	stopLoop()
	<-loopDone
	return errors.Join(errs...)
}

// Stopping is closed once the shutdown began: at the stop signal, before
// the shutdown delay, or when a server or part stopped on its own.
func (s *Server) Stopping() <-chan struct{} { return s.stopping }

// serve starts the servers on their listeners; the channel receives the
// error of each one that stops other than by the drain.
func (s *Server) serve() <-chan error {
	errc := make(chan error, 5)
	go func() { errc <- s.grpcSrv.Serve(s.grpcLn) }()
	if s.replicaSrv != nil {
		go func() {
			if err := s.replicaSrv.Serve(s.replicaLn); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				errc <- err
			}
		}()
	}
	go func() { errc <- s.healthSrv.Serve(s.healthLn) }()
	httpServe := func(srv *http.Server, ln net.Listener) {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	}
	go httpServe(s.metricsSrv, s.metricsLn)
	if s.statusSrv != nil {
		go httpServe(s.statusSrv, s.statusLn)
	}
	if s.pprofSrv != nil {
		s.log.Info("serving pprof", "address", s.pprofLn.Addr().String())
		go httpServe(s.pprofSrv, s.pprofLn)
	}
	return errc
}

// TransportOptions are the ext_proc server's HTTP/2 transport settings.
// They are exported so the load tool's reference server (test/load's
// floor) runs on exactly the picker's transport.
func TransportOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		// Static flow-control windows turn off gRPC's BDP estimator, which
		// otherwise answers incoming data with PING frames: on a gateway
		// link carrying thousands of short streams that is one extra write
		// and read per burst for nothing (measured: 4.9 -> 3.7 write
		// syscalls per request at 1,000/s). Envoy itself grants large
		// static windows, so the link is never window-bound either way.
		grpc.InitialWindowSize(1 << 20),
		grpc.InitialConnWindowSize(1 << 24),
	}
}

// serverTLS returns the ext_proc server's TLS config: the certificate in
// opts.CertPath (tls.crt, tls.key) or a self-signed one made at start, and
// with opts.ClientCA the client certificates required and verified
// against that bundle. Both files are reread at the next handshake after
// they change, which a Kubernetes Secret update does by swapping a
// symlink: new connections get the new material, established ones keep
// theirs. Gateways reach the picker through a Service and by default do
// not verify it (as with the upstream picker); mount a real certificate
// with --cert-path.
func serverTLS(opts *Options, log logr.Logger) (*tls.Config, error) {
	var getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	if opts.CertPath == "" {
		cert, err := tlsutil.SelfSigned()
		if err != nil {
			return nil, err
		}
		getCert = tlsutil.Static(cert)
	} else {
		r, err := tlsutil.NewReloader(opts.CertPath, reloadLogger(log, "serving certificate", opts.CertPath))
		if err != nil {
			return nil, fmt.Errorf("--cert-path: %w", err)
		}
		getCert = r.GetCertificate
	}
	if opts.ClientCA == "" {
		return tlsutil.ServerConfig(getCert), nil
	}
	cas, err := tlsutil.NewCAReloader(opts.ClientCA, reloadLogger(log, "client CA bundle", opts.ClientCA))
	if err != nil {
		return nil, fmt.Errorf("--client-ca: %w", err)
	}
	return tlsutil.MutualServerConfig(getCert, cas.Pool), nil
}

// reloadLogger logs the reloads of TLS material at path.
func reloadLogger(log logr.Logger, what, path string) func(error) {
	return func(err error) {
		if err != nil {
			log.Error(err, what+" not reloaded; the previous one stays in use", "path", path)
			return
		}
		log.Info(what+" reloaded", "path", path)
	}
}
