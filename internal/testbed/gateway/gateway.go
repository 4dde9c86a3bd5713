package gateway

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/tlsutil"
	"github.com/laneway-dev/laneway/pkg/extproc"
)

// HeaderServedBy names, on the client response, the endpoint that served the
// request.
const HeaderServedBy = "x-laneway-endpoint"

// Options configures a Gateway. The zero value is usable.
type Options struct {
	// Timeout bounds one whole request: queueing in the picker, the upstream
	// exchange and the response. Zero means no bound.
	Timeout time.Duration
	// MaxBodyBytes bounds the request body the gateway buffers, like Envoy's
	// buffer limit; larger bodies get 413. Zero means 64 MiB.
	MaxBodyBytes int64
	// DialTimeout bounds connecting to an endpoint before the next one is
	// tried. Zero means 2 s.
	DialTimeout time.Duration
	// Logger receives per-request errors at verbosity 2.
	Logger logr.Logger
	// Shape is the ext_proc gateway played: Envoy with every phase (the
	// zero value), or a header-only one (extprocclient.EnvoySkip,
	// extprocclient.NginxShim) whose streams end with the picker's answer,
	// the response then going to the client without the picker seeing it.
	Shape extprocclient.Shape
}

// Gateway is an http.Handler that routes every request through a picker.
type Gateway struct {
	epps      []*extprocclient.Client
	next      atomic.Uint64 // round robin over epps
	transport *http.Transport
	opts      Options

	// retried counts requests decided by another picker after theirs
	// failed before deciding; unpicked, responses finished without their
	// picker after it failed (FailoverStats).
	retried, unpicked atomic.Int64
}

// New returns a Gateway that consults the pickers behind conns, each
// request the next one in turn (as a Service spreads a gateway's streams
// over the picker's replicas), one long-lived connection per picker. With
// several, a request whose picker fails before deciding is asked of the
// next one (nothing was sent upstream), and a response whose picker fails
// after deciding is finished without it: every request is answered once
// while a picker dies.
func New(conns []grpc.ClientConnInterface, opts Options) *Gateway {
	epps := make([]*extprocclient.Client, len(conns))
	for i, c := range conns {
		epps[i] = extprocclient.New(c, extprocclient.Options{Shape: opts.Shape})
	}
	return newGateway(epps, opts)
}

// NewPerRequest returns a Gateway that opens a new connection to the
// picker with dial for every request and closes it when the request ends,
// as NGINX Gateway Fabric's endpoint-picker shim does.
func NewPerRequest(dial func() (*grpc.ClientConn, error), opts Options) *Gateway {
	return newGateway([]*extprocclient.Client{extprocclient.NewPerRequest(dial, extprocclient.Options{Shape: opts.Shape})}, opts)
}

func newGateway(epps []*extprocclient.Client, opts Options) *Gateway {
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 64 << 20
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 2 * time.Second
	}
	return &Gateway{
		epps: epps,
		transport: &http.Transport{
			// No Proxy: endpoints are pod addresses, never reached through
			// an environment-configured proxy.
			DialContext:         (&net.Dialer{Timeout: opts.DialTimeout}).DialContext,
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		},
		opts: opts,
	}
}

// Close releases idle upstream connections.
func (g *Gateway) Close() { g.transport.CloseIdleConnections() }

// hopHeaders are connection-scoped and never forwarded (RFC 9110 §7.6.1).
var hopHeaders = []string{
	"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

func stripHop(h http.Header) http.Header {
	h = h.Clone()
	if h == nil {
		h = http.Header{}
	}
	for _, f := range h.Values("Connection") {
		for name := range strings.SplitSeq(f, ",") {
			h.Del(strings.TrimSpace(name))
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
	return h
}

// writeError answers the client with a JSON error the way the picker's own
// immediate responses look.
func writeError(w http.ResponseWriter, status int, reason, msg string) {
	b, _ := json.Marshal(map[string]string{"error": msg})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set(extproc.HeaderReason, reason)
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// ServeHTTP routes one request.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if g.opts.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.opts.Timeout)
		defer cancel()
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, g.opts.MaxBodyBytes+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, "read_body", fmt.Sprintf("read request body: %v", err))
		return
	}
	if int64(len(body)) > g.opts.MaxBodyBytes {
		writeError(w, http.StatusRequestEntityTooLarge, "body_too_large",
			fmt.Sprintf("request body exceeds %d bytes", g.opts.MaxBodyBytes))
		return
	}
	reqHeader := stripHop(r.Header)
	reqHeader.Del("Content-Length") // the client library sets the real one
	spec := extprocclient.RequestSpec{
		Method: r.Method, Path: r.URL.RequestURI(), Authority: r.Host, Scheme: "http",
		Headers: reqHeader, Body: body,
	}
	first := g.next.Add(1)
	var ex *extprocclient.Exchange
	for i := range uint64(len(g.epps)) {
		ex, err = g.epps[(first+i)%uint64(len(g.epps))].Start(ctx, spec)
		if err == nil || ctx.Err() != nil || len(g.epps) == 1 || !pickerGone(err) {
			break
		}
		if i+1 < uint64(len(g.epps)) {
			g.retried.Add(1)
			g.opts.Logger.V(2).Info("endpoint picker failed before deciding; asking the next", "error", err.Error())
		}
	}
	if err != nil {
		if r.Context().Err() != nil {
			return // the client went away; nobody to answer
		}
		if ctx.Err() != nil || status.Code(err) == codes.DeadlineExceeded {
			writeError(w, http.StatusGatewayTimeout, "timeout", fmt.Sprintf("no endpoint within %v", g.opts.Timeout))
			return
		}
		g.opts.Logger.V(2).Info("ext_proc exchange failed", "path", r.URL.Path, "error", err.Error())
		// Envoy with failure_mode_allow false answers a failed ext_proc
		// stream with 500 as well.
		writeError(w, http.StatusInternalServerError, "ext_proc_error", "endpoint picker failed")
		return
	}
	defer ex.Close()
	if ex.Ended() {
		// A header-only stream is over: its connection, when it has one
		// of its own, goes now, as the shim's does, not after the
		// response.
		_ = ex.Close()
	}
	d := ex.Decision()
	if !d.Routed() {
		for k, vs := range d.Immediate.Headers {
			w.Header()[k] = vs
		}
		w.WriteHeader(d.Immediate.Status)
		_, _ = w.Write(d.Immediate.Body)
		return
	}
	g.forward(ctx, w, r, ex, reqHeader)
}

// forward sends the routed request upstream, falling back down the endpoint
// list on connect failures, and streams the response back through the
// picker.
func (g *Gateway) forward(ctx context.Context, w http.ResponseWriter, r *http.Request, ex *extprocclient.Exchange, reqHeader http.Header) {
	d := ex.Decision()
	endpoints := d.Endpoints
	if len(endpoints) == 0 {
		endpoints = d.MetadataEndpoints
	}
	if len(endpoints) == 0 {
		writeError(w, http.StatusInternalServerError, "no_destination", "endpoint picker answered without an endpoint")
		return
	}
	d.Mutation.Apply(reqHeader)
	reqHeader.Del("Content-Length") // carried by ContentLength below

	var (
		resp   *http.Response
		served string
		err    error
	)
	for _, ep := range endpoints {
		var req *http.Request
		req, err = http.NewRequestWithContext(ctx, r.Method, "http://"+ep+r.URL.RequestURI(), bytes.NewReader(d.Body))
		if err != nil {
			break // a malformed endpoint is a picker bug, not a connect failure
		}
		req.Header = reqHeader
		req.Host = r.Host
		req.ContentLength = int64(len(d.Body))
		if len(d.Body) == 0 {
			req.Body = http.NoBody
		}
		resp, err = g.transport.RoundTrip(req)
		if err == nil {
			served = ep
			break
		}
		if !isConnectError(err) {
			break
		}
		g.opts.Logger.V(2).Info("endpoint unreachable, trying the next", "endpoint", ep, "error", err.Error())
	}
	if resp == nil {
		if r.Context().Err() != nil {
			return
		}
		if ctx.Err() != nil {
			writeError(w, http.StatusGatewayTimeout, "timeout", fmt.Sprintf("upstream did not answer within %v", g.opts.Timeout))
			return
		}
		// Envoy's answer when no upstream connection could be made.
		writeError(w, http.StatusServiceUnavailable, "upstream_connect_error", fmt.Sprintf("upstream: %v", err))
		return
	}
	defer resp.Body.Close()

	respHeader := stripHop(resp.Header)
	noBody := resp.Body == http.NoBody || resp.ContentLength == 0
	if ex.Ended() {
		// A header-only gateway: the response goes to the client
		// without the picker.
		respHeader.Set(HeaderServedBy, served)
		for k, vs := range respHeader {
			w.Header()[k] = vs
		}
		w.WriteHeader(resp.StatusCode)
		if !noBody {
			g.copyBody(w, resp.Body)
		}
		return
	}
	mut, err := ex.SendResponseHeaders(resp.StatusCode, respHeader, noBody, served)
	if err != nil && len(g.epps) > 1 && pickerGone(err) {
		// The picker died after deciding: the request is upstream, and
		// its response goes to the client without the picker.
		g.unpicked.Add(1)
		g.opts.Logger.V(2).Info("endpoint picker failed after deciding; finishing the response without it", "error", err.Error())
		ex, mut, err = nil, &extprocclient.HeaderMutation{}, nil
	}
	if err != nil {
		g.opts.Logger.V(2).Info("ext_proc response headers failed", "error", err.Error())
		writeError(w, http.StatusBadGateway, "ext_proc_error", "endpoint picker failed on the response")
		return
	}
	mut.Apply(respHeader)
	// Like Envoy in FULL_DUPLEX_STREAMED mode: the picker may change the
	// body, so the upstream length cannot be trusted.
	respHeader.Del("Content-Length")
	respHeader.Set(HeaderServedBy, served)
	for k, vs := range respHeader {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	if noBody {
		return
	}
	// The headers go to the client at once, as Envoy forwards them once the
	// picker has seen them: a streaming client sees its request accepted
	// while it still waits for its first token (modelsim, like vLLM, sends
	// its headers as it takes the request).
	if err := http.NewResponseController(w).Flush(); err != nil {
		return
	}
	g.streamBody(w, resp.Body, ex)
}

// streamBody passes each upstream read through the picker and flushes it to
// the client at once. A failure after the headers went out can only be
// signalled by resetting the client connection.
func (g *Gateway) streamBody(w http.ResponseWriter, body io.Reader, ex *extprocclient.Exchange) {
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, rerr := body.Read(buf)
		eos := errors.Is(rerr, io.EOF)
		if rerr != nil && !eos {
			g.opts.Logger.V(2).Info("upstream body failed", "error", rerr.Error())
			panic(http.ErrAbortHandler)
		}
		if n == 0 && !eos {
			continue
		}
		out := buf[:n]
		if ex != nil {
			var err error
			out, err = ex.SendResponseBody(buf[:n], eos)
			if err != nil && len(g.epps) > 1 && pickerGone(err) {
				g.unpicked.Add(1)
				g.opts.Logger.V(2).Info("endpoint picker failed after deciding; finishing the response without it", "error", err.Error())
				ex, out, err = nil, buf[:n], nil
			}
			if err != nil {
				g.opts.Logger.V(2).Info("ext_proc response body failed", "error", err.Error())
				panic(http.ErrAbortHandler)
			}
		}
		if len(out) > 0 {
			if _, err := w.Write(out); err != nil {
				return // client gone; Close resets the stream
			}
		}
		if err := rc.Flush(); err != nil {
			return
		}
		if eos {
			return
		}
	}
}

// pickerGone reports whether err is a picker that went away (its
// connection refused or broken; a send on a stream the server ended
// reports io.EOF), not an answer of a live one.
func pickerGone(err error) bool {
	return status.Code(err) == codes.Unavailable || errors.Is(err, io.EOF)
}

// FailoverStats reports how many requests another picker decided after
// theirs failed before deciding, and how many responses were finished
// without their picker after it failed.
func (g *Gateway) FailoverStats() (retried, unpicked int64) {
	return g.retried.Load(), g.unpicked.Load()
}

// copyBody streams an upstream body straight to the client, flushing
// each read so server-sent events arrive as they are produced.
func (g *Gateway) copyBody(w http.ResponseWriter, body io.Reader) {
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			if _, err := w.Write(buf[:n]); err != nil {
				return // client gone
			}
			if err := rc.Flush(); err != nil {
				return
			}
		}
		if errors.Is(rerr, io.EOF) {
			return
		}
		if rerr != nil {
			g.opts.Logger.V(2).Info("upstream body failed", "error", rerr.Error())
			panic(http.ErrAbortHandler)
		}
	}
}

// isConnectError reports whether err means no connection could be made, the
// only failure after which another endpoint may be tried without risking a
// request being processed twice.
func isConnectError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// DialOptions configures the gRPC connection to the picker.
type DialOptions struct {
	// TLS dials with TLS (ALPN h2); the picker serves TLS by default.
	TLS bool
	// InsecureSkipVerify accepts any server certificate, which the picker's
	// default self-signed certificate needs.
	InsecureSkipVerify bool
	// CAFile, when set, is a PEM bundle to verify the picker against.
	CAFile string
	// ServerName overrides the name verified in the picker's certificate.
	ServerName string
}

// Dial returns a gRPC client connection to the picker at addr.
func Dial(addr string, o DialOptions) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if o.TLS {
		cfg := tlsutil.ClientConfig(o.InsecureSkipVerify)
		cfg.ServerName = o.ServerName
		if o.CAFile != "" {
			pool, err := loadPool(o.CAFile)
			if err != nil {
				return nil, err
			}
			cfg.RootCAs = pool
		}
		creds = credentials.NewTLS(cfg)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("dial endpoint picker %s: %w", addr, err)
	}
	return conn, nil
}

func loadPool(path string) (*x509.CertPool, error) {
	pemData, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemData) {
		return nil, fmt.Errorf("CA file %s holds no PEM certificate", path)
	}
	return pool, nil
}
