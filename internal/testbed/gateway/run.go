package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
)

// Config is the command-line configuration of the local gateway.
type Config struct {
	// Listen is the HTTP/1.1 listen address.
	Listen string
	// EPP is the pickers' gRPC addresses, comma-separated: each request
	// goes to the next one (the replicas behind a Service).
	EPP string
	// Dial configures the connection to the picker.
	Dial DialOptions
	// Gateway holds the per-request options. Its Shape is set from
	// ResponsePhases and ConnPerRequest.
	Gateway Options
	// ResponsePhases plays the response phases on the ext_proc stream
	// (Envoy with every phase). Off, the gateway sends only the request
	// and half-closes: Envoy with the response phases skipped, or, with
	// ConnPerRequest, NGINX Gateway Fabric's endpoint-picker shim.
	ResponsePhases bool
	// ConnPerRequest opens a new connection to the picker for every
	// request instead of one long-lived connection.
	ConnPerRequest bool
	// Verbosity is the log level (2 default, 4 per-request diagnostics).
	Verbosity int
}

// NewConfig returns the defaults: listen on 127.0.0.1:8080, picker on
// 127.0.0.1:9002 over TLS.
func NewConfig() *Config {
	return &Config{
		Listen:         "127.0.0.1:8080",
		EPP:            "127.0.0.1:9002",
		Dial:           DialOptions{TLS: true},
		Gateway:        Options{Timeout: 10 * time.Minute, MaxBodyBytes: 64 << 20, DialTimeout: 2 * time.Second},
		ResponsePhases: true,
		Verbosity:      2,
	}
}

// AddFlags registers the configuration's flags.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Listen, "listen", c.Listen, "HTTP listen address")
	fs.StringVar(&c.EPP, "epp", c.EPP, "endpoint picker gRPC address (host:port); several, comma-separated, take the requests in turn, and one that fails is replaced by the next for the request it failed")
	fs.BoolVar(&c.Dial.TLS, "epp-tls", c.Dial.TLS, "connect to the endpoint picker over TLS (ALPN h2)")
	fs.BoolVar(&c.Dial.InsecureSkipVerify, "epp-insecure-skip-verify", c.Dial.InsecureSkipVerify,
		"accept any picker certificate (needed for its default self-signed one)")
	fs.StringVar(&c.Dial.CAFile, "epp-ca-file", c.Dial.CAFile, "PEM bundle to verify the picker's certificate against")
	fs.StringVar(&c.Dial.ServerName, "epp-server-name", c.Dial.ServerName, "name to verify in the picker's certificate")
	fs.DurationVar(&c.Gateway.Timeout, "timeout", c.Gateway.Timeout,
		"bound on one whole request: queueing in the picker, upstream and response (0 = none)")
	fs.Int64Var(&c.Gateway.MaxBodyBytes, "max-body-bytes", c.Gateway.MaxBodyBytes, "largest request body accepted")
	fs.DurationVar(&c.Gateway.DialTimeout, "dial-timeout", c.Gateway.DialTimeout,
		"bound on connecting to one endpoint before falling back to the next")
	fs.BoolVar(&c.ResponsePhases, "response-phases", c.ResponsePhases,
		"send the response phases to the picker; false sends only the request and half-closes the stream, "+
			"as Envoy with the response phases skipped does (with --epp-conn-per-request: as NGINX Gateway Fabric's endpoint-picker shim)")
	fs.BoolVar(&c.ConnPerRequest, "epp-conn-per-request", c.ConnPerRequest,
		"open a new connection to the picker for every request instead of one long-lived connection")
	fs.IntVarP(&c.Verbosity, "v", "v", c.Verbosity, "log verbosity")
}

// Shape is the ext_proc gateway the flags ask for.
func (c *Config) Shape() extprocclient.Shape {
	switch {
	case c.ResponsePhases:
		return extprocclient.Envoy
	case c.ConnPerRequest:
		return extprocclient.NginxShim
	default:
		return extprocclient.EnvoySkip
	}
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("--listen %q: %w", c.Listen, err)
	}
	for _, a := range strings.Split(c.EPP, ",") {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("--epp %q: %w", a, err)
		}
	}
	if c.Gateway.Timeout < 0 {
		return fmt.Errorf("--timeout %v: must not be negative", c.Gateway.Timeout)
	}
	if c.Gateway.MaxBodyBytes <= 0 {
		return fmt.Errorf("--max-body-bytes %d: must be positive", c.Gateway.MaxBodyBytes)
	}
	if !c.Dial.TLS && (c.Dial.InsecureSkipVerify || c.Dial.CAFile != "") {
		return errors.New("--epp-insecure-skip-verify and --epp-ca-file need --epp-tls")
	}
	return nil
}

// Run serves the gateway until ctx ends, then drains in-flight requests for
// up to 10 s.
func Run(ctx context.Context, c *Config, log logr.Logger) error {
	opts := c.Gateway
	opts.Logger = log
	opts.Shape = c.Shape()
	addrs := strings.Split(c.EPP, ",")
	var g *Gateway
	if c.ConnPerRequest {
		epps := make([]*extprocclient.Client, len(addrs))
		for i, a := range addrs {
			epps[i] = extprocclient.NewPerRequest(func() (*grpc.ClientConn, error) { return Dial(a, c.Dial) },
				extprocclient.Options{Shape: opts.Shape})
		}
		g = newGateway(epps, opts)
	} else {
		conns := make([]grpc.ClientConnInterface, 0, len(addrs))
		for _, a := range addrs {
			conn, err := Dial(a, c.Dial)
			if err != nil {
				return err
			}
			defer conn.Close()
			conns = append(conns, conn)
		}
		g = New(conns, opts)
	}
	defer g.Close()

	lis, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", c.Listen, err)
	}
	srv := &http.Server{Handler: g, ReadHeaderTimeout: 30 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	log.Info("gateway serving", "listen", lis.Addr().String(), "epp", c.EPP, "eppTLS", c.Dial.TLS,
		"shape", opts.Shape.String(), "eppConnPerRequest", c.ConnPerRequest)
	select {
	case err := <-errc:
		return fmt.Errorf("serve %s: %w", c.Listen, err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shut down: %w", err)
	}
	if len(addrs) > 1 {
		retried, unpicked := g.FailoverStats()
		log.Info("gateway stopped", "pickerRetries", retried, "responsesWithoutPicker", unpicked)
	}
	return nil
}
