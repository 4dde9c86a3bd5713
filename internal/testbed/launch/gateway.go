package launch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// gatewayServing is the line cmd/gateway logs once it listens, with its
// address in the field "listen".
const gatewayServing = "gateway serving"

// GatewayOptions describe one cmd/gateway process.
type GatewayOptions struct {
	// EPP is the picker the gateway asks: --epp is its ext_proc
	// address, over TLS without verification (self-signed) when it serves
	// TLS.
	EPP *EPP
	// EPPs, instead of EPP, are replicas the gateway asks in turn (all
	// plaintext or all TLS, as the first).
	EPPs []*EPP
	// Listen is --listen; empty is 127.0.0.1 on a port the kernel picks.
	Listen string
	// Timeout is --timeout, the bound on one whole request; 0 keeps the
	// gateway's default.
	Timeout time.Duration
	// HeaderOnly is --response-phases=false: the gateway sends the picker
	// only the request and half-closes each stream, as gateways that
	// send no response phase do (Envoy with them skipped; with
	// ConnPerRequest, NGINX Gateway Fabric's endpoint-picker shim).
	HeaderOnly bool
	// ConnPerRequest is --epp-conn-per-request: a new connection to the
	// picker for every request.
	ConnPerRequest bool
	// Args are further flags.
	Args []string
	// Proc holds the options every start takes.
	Proc ProcOptions
}

// Gateway is a running cmd/gateway.
type Gateway struct {
	*Proc
	// Addr is its listen "host:port"; URL is "http://" + Addr, the base
	// URL of the OpenAI API it proxies.
	Addr, URL string
}

// StartGateway starts the gateway and returns once it listens.
func (b Binaries) StartGateway(ctx context.Context, o GatewayOptions) (*Gateway, error) {
	bin, err := binary(b.Gateway, CmdGateway)
	if err != nil {
		return nil, err
	}
	epps := o.EPPs
	if o.EPP != nil {
		epps = append([]*EPP{o.EPP}, epps...)
	}
	if len(epps) == 0 {
		return nil, errors.New("gateway: no picker to ask")
	}
	addrs := make([]string, len(epps))
	for i, p := range epps {
		addrs[i] = p.GRPCAddr
	}
	args := []string{
		"--listen=" + cmp.Or(o.Listen, "127.0.0.1:0"),
		"--epp=" + strings.Join(addrs, ","),
		fmt.Sprintf("--epp-tls=%t", epps[0].TLS),
	}
	if epps[0].TLS {
		args = append(args, "--epp-insecure-skip-verify")
	}
	if o.Timeout != 0 {
		args = append(args, "--timeout="+o.Timeout.String())
	}
	if o.HeaderOnly {
		args = append(args, "--response-phases=false")
	}
	if o.ConnPerRequest {
		args = append(args, "--epp-conn-per-request")
	}
	args = append(args, o.Args...)
	proc, err := o.Proc.start(CmdGateway, bin, args)
	if err != nil {
		return nil, err
	}
	var line struct{ Listen string }
	if err := awaitFields(ctx, proc, gatewayServing, o.Proc.readyTimeout(), &line); err != nil {
		proc.Kill()
		return nil, fmt.Errorf("%w\nargs: %v", err, args)
	}
	return &Gateway{Proc: proc, Addr: line.Listen, URL: "http://" + line.Listen}, nil
}

// RunGateway starts the gateway for the test t and stops it at t's
// cleanup, as RunEPP does.
func (b Binaries) RunGateway(t TB, o GatewayOptions) *Gateway {
	t.Helper()
	g, err := b.StartGateway(context.Background(), o)
	if err != nil {
		t.Fatalf("start gateway: %v", err)
	}
	watch(t, g.Proc, o.Proc.stopGrace())
	return g
}
