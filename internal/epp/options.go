package epp

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/laneway-dev/laneway/pkg/policy"
)

// Default ports, shared with the upstream endpoint picker so gateway and
// chart wiring carries over.
const (
	DefaultGRPCPort       = 9002
	DefaultGRPCHealthPort = 9003
	DefaultMetricsPort    = 9090
)

// Options are the endpoint picker's settings. AddFlags binds them to
// flags; Complete fills derived values; Validate checks them.
type Options struct {
	// Endpoints are the standalone mode's model-server endpoints.
	Endpoints []string
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
	// MaxNumBatchedTokens is the default max_num_batched_tokens of an
	// endpoint, used by prefill_busy_threshold_frac.
	MaxNumBatchedTokens uint64
	// EngineType is the model servers' engine: vllm, sglang or trtllm.
	EngineType string
	// DrainTimeout bounds how long dispatched streams may finish after
	// SIGTERM.
	DrainTimeout time.Duration
	// MaxFallbacks is how many fallback endpoints follow the pick.
	MaxFallbacks int
	// MaxBodyBytes bounds a request body (400 beyond it).
	MaxBodyBytes int
	// PolicyPollInterval is how often the policy file is checked for
	// changes.
	PolicyPollInterval time.Duration
	// Verbosity is the log level (-v): 2 default, 3 verbose, 4 debug, 5 trace.
	Verbosity int

	// Engine is EngineType parsed by Complete.
	Engine policy.Engine
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{
		BindAddress:         "",
		GRPCPort:            DefaultGRPCPort,
		GRPCHealthPort:      DefaultGRPCHealthPort,
		MetricsPort:         DefaultMetricsPort,
		SecureServing:       true,
		MaxNumBatchedTokens: 8192,
		EngineType:          "vllm",
		DrainTimeout:        30 * time.Second,
		MaxFallbacks:        2,
		MaxBodyBytes:        16 << 20,
		PolicyPollInterval:  time.Second,
		Verbosity:           2,
	}
}

// AddFlags binds the options to fs. The names are fixed: operators, the
// chart and the tests rely on them.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringSliceVar(&o.Endpoints, "endpoints", o.Endpoints, "Standalone mode: model-server endpoints as ip:port,...")
	fs.StringVar(&o.PolicyConfig, "policy-config", o.PolicyConfig, "Policy YAML in the reference router's format; reloaded when it changes.")
	fs.StringVar(&o.BindAddress, "bind-address", o.BindAddress, "Address the gRPC, health and metrics servers listen on (empty: all interfaces).")
	fs.IntVar(&o.GRPCPort, "grpc-port", o.GRPCPort, "ext_proc gRPC port.")
	fs.IntVar(&o.GRPCHealthPort, "grpc-health-port", o.GRPCHealthPort, "gRPC health port (liveness, readiness).")
	fs.IntVar(&o.MetricsPort, "metrics-port", o.MetricsPort, "Prometheus metrics port.")
	fs.BoolVar(&o.SecureServing, "secure-serving", o.SecureServing, "Serve ext_proc over TLS (ALPN h2); self-signed unless --cert-path is set.")
	fs.StringVar(&o.CertPath, "cert-path", o.CertPath, "Folder holding tls.crt and tls.key for the ext_proc server.")
	fs.Uint64Var(&o.MaxNumBatchedTokens, "max-num-batched-tokens", o.MaxNumBatchedTokens, "Default max_num_batched_tokens of a model server.")
	fs.StringVar(&o.EngineType, "engine-type", o.EngineType, "Model-server engine: vllm, sglang or trtllm.")
	fs.DurationVar(&o.DrainTimeout, "drain-timeout", o.DrainTimeout, "After SIGTERM, how long dispatched streams may take to finish.")
	fs.IntVar(&o.MaxFallbacks, "max-fallbacks", o.MaxFallbacks, "Fallback endpoints returned after the pick.")
	fs.IntVar(&o.MaxBodyBytes, "max-body-bytes", o.MaxBodyBytes, "Largest request body accepted (400 beyond it).")
	fs.DurationVar(&o.PolicyPollInterval, "policy-poll-interval", o.PolicyPollInterval, "How often --policy-config is checked for changes.")
	fs.IntVarP(&o.Verbosity, "v", "v", o.Verbosity, "Log verbosity: 2 default, 3 verbose, 4 debug, 5 trace.")
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
	return nil
}

// Validate checks the options.
func (o *Options) Validate() error {
	var errs []error
	for _, ep := range o.Endpoints {
		if _, _, err := net.SplitHostPort(ep); err != nil {
			errs = append(errs, fmt.Errorf("--endpoints: %q is not ip:port: %w", ep, err))
		}
	}
	for name, p := range map[string]int{"--grpc-port": o.GRPCPort, "--grpc-health-port": o.GRPCHealthPort, "--metrics-port": o.MetricsPort} {
		if p < 0 || p > 65535 {
			errs = append(errs, fmt.Errorf("%s: %d is not a port", name, p))
		}
	}
	if o.MaxFallbacks < 0 {
		errs = append(errs, fmt.Errorf("--max-fallbacks: %d is negative", o.MaxFallbacks))
	}
	if o.MaxBodyBytes <= 0 {
		errs = append(errs, fmt.Errorf("--max-body-bytes: %d must be positive", o.MaxBodyBytes))
	}
	if o.DrainTimeout < 0 {
		errs = append(errs, fmt.Errorf("--drain-timeout: %s is negative", o.DrainTimeout))
	}
	return errors.Join(errs...)
}
