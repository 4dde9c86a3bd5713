package launch

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// pollEvery is the pause between two checks of Poll (and so of WaitFor):
// what it polls raises no event the caller could wait on.
const pollEvery = 10 * time.Millisecond

// Check is one probe; nil means the awaited state holds.
type Check func(ctx context.Context) error

// Poll runs check until it returns nil, p exits (p may be nil), ctx ends or
// timeout passes; the error names what and the last check's error. It is
// the one polling loop of the package: WaitFor is Poll with a test's
// failure message.
func Poll(ctx context.Context, p *Proc, what string, timeout time.Duration, check Check) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if p != nil {
			if err := p.Exited(); err != nil {
				return fmt.Errorf("%s not ready: %w", what, err)
			}
		}
		if last = check(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready within %s: %w (last: %v)", what, timeout, ctx.Err(), last)
		case <-time.After(pollEvery):
		}
	}
}

// httpClient bounds one probe so a server that accepts but never answers
// fails the check instead of the whole wait.
var httpClient = &http.Client{Timeout: 5 * time.Second}

// HTTPOK is ready when GET url answers 200.
func HTTPOK(url string) Check {
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return fmt.Errorf("GET %s: %w", url, err)
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return nil
	}
}

// TCPOpen is ready when addr accepts a TCP connection.
func TCPOpen(addr string) Check {
	return func(ctx context.Context) error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	}
}

// fastConnect reconnects quickly: a process binds its ports milliseconds
// after exec, and gRPC's default first retry comes only after a second.
var fastConnect = grpc.WithConnectParams(grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.5, MaxDelay: 200 * time.Millisecond},
	MinConnectTimeout: time.Second,
})

// Dial opens a gRPC client connection to addr with creds (nil means
// plaintext) that reconnects quickly while the server starts.
func Dial(addr string, creds credentials.TransportCredentials) (*grpc.ClientConn, error) {
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds), fastConnect)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return conn, nil
}

// WaitGRPCServing watches the gRPC health service named service on addr
// until it reports SERVING; it gives up when p exits (p may be nil), ctx
// ends or timeout passes. creds nil means plaintext.
func WaitGRPCServing(ctx context.Context, p *Proc, addr, service string, creds credentials.TransportCredentials, timeout time.Duration) error {
	conn, err := Dial(addr, creds)
	if err != nil {
		return fmt.Errorf("health of %s: %w", service, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var exited <-chan struct{}
	if p != nil {
		exited = p.Done()
	}
	go func() {
		select {
		case <-exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	last := healthpb.HealthCheckResponse_UNKNOWN
	failed := func(err error) error {
		if p != nil {
			if xerr := p.Exited(); xerr != nil {
				return fmt.Errorf("before health %s on %s was SERVING: %w", service, addr, xerr)
			}
		}
		return fmt.Errorf("watch health %s on %s (last %v, timeout %s): %w", service, addr, last, timeout, err)
	}
	stream, err := healthpb.NewHealthClient(conn).Watch(ctx,
		&healthpb.HealthCheckRequest{Service: service}, grpc.WaitForReady(true))
	if err != nil {
		return failed(err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return failed(err)
		}
		last = resp.GetStatus()
		if last == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
	}
}
