package integration

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/internal/tlsutil"
	"github.com/laneway-dev/laneway/pkg/extproc"
)

// secretDir is a directory laid out as the kubelet lays out a Secret or
// ConfigMap volume: each file is a symlink through ..data, which points at
// a timestamped directory; an update writes a new directory and swaps
// ..data in one rename, so a reader sees the old set or the new one.
type secretDir struct {
	t   *testing.T
	dir string
	gen int
}

// newSecretDir creates the volume with its first contents.
func newSecretDir(t *testing.T, files map[string][]byte) *secretDir {
	t.Helper()
	s := &secretDir{t: t, dir: t.TempDir()}
	s.update(files)
	for name := range files {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(s.dir, name)); err != nil {
			t.Fatalf("link %s: %v", name, err)
		}
	}
	return s
}

// update swaps in new contents for the same file names.
func (s *secretDir) update(files map[string][]byte) {
	s.t.Helper()
	s.gen++
	gen := fmt.Sprintf("..gen_%d", s.gen)
	if err := os.Mkdir(filepath.Join(s.dir, gen), 0o700); err != nil {
		s.t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(s.dir, gen, name), data, 0o600); err != nil {
			s.t.Fatal(err)
		}
	}
	tmp := filepath.Join(s.dir, "..data_tmp")
	if err := os.Symlink(gen, tmp); err != nil {
		s.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, "..data")); err != nil {
		s.t.Fatal(err)
	}
}

// path is the path of one file of the volume.
func (s *secretDir) path(name string) string { return filepath.Join(s.dir, name) }

func newCA(t *testing.T, name string) *tlsutil.CA {
	t.Helper()
	ca, err := tlsutil.NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// pairFiles is a key pair as the files of a kubernetes.io/tls Secret.
func pairFiles(t *testing.T, cert tls.Certificate) map[string][]byte {
	t.Helper()
	c, k, err := tlsutil.EncodePEM(cert)
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]byte{tlsutil.CertFile: c, tlsutil.KeyFile: k}
}

func issueClient(t *testing.T, ca *tlsutil.CA, name string) *tls.Certificate {
	t.Helper()
	c, err := ca.Client(name)
	if err != nil {
		t.Fatal(err)
	}
	return &c
}

func issueServer(t *testing.T, ca *tlsutil.CA, name string) tls.Certificate {
	t.Helper()
	c, err := ca.Server(name)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// gatewayTLS is a gateway's TLS to the picker: ALPN h2, the picker's
// certificate not verified (self-signed pickers are the default), and
// cert, when not nil, as the client certificate.
func gatewayTLS(cert *tls.Certificate) *tls.Config {
	cfg := tlsutil.ClientConfig(true)
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return cfg
}

// probeTLS opens one TLS connection to addr and waits for the picker's
// first HTTP/2 frame, which a gRPC server writes as soon as the handshake
// is over: with TLS 1.3 a client's handshake completes before the server
// has judged the client's certificate, and a refusal arrives as an alert
// on that first read. It returns the serial number of the certificate the
// picker served.
func probeTLS(addr string, cfg *tls.Config) (string, error) {
	d := &net.Dialer{Timeout: launch.EventTimeout}
	conn, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if err := conn.SetReadDeadline(time.Now().Add(launch.EventTimeout)); err != nil {
		return "", err
	}
	if _, err := conn.Read(make([]byte, 1)); err != nil {
		return "", fmt.Errorf("first read: %w", err)
	}
	st := conn.ConnectionState()
	if st.NegotiatedProtocol != "h2" {
		return "", fmt.Errorf("ALPN %q, want h2", st.NegotiatedProtocol)
	}
	return st.PeerCertificates[0].SerialNumber.String(), nil
}

// healthOver asks the ext_proc port's health service over conn.
func healthOver(conn *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(context.Background(), launch.EventTimeout)
	defer cancel()
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: extproc.ServiceName})
	if err != nil {
		return err
	}
	if r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("health %v", r.GetStatus())
	}
	return nil
}

// dialGateway is a gRPC connection to the picker with cfg, closed at the
// test's cleanup.
func dialGateway(t *testing.T, addr string, cfg *tls.Config) *grpc.ClientConn {
	t.Helper()
	conn, err := launch.Dial(addr, credentials.NewTLS(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestMutualTLS: with --client-ca the ext_proc port serves only clients
// whose certificate verifies against that bundle: one without a
// certificate and one from another CA are refused at the handshake, one
// from the CA gets picks.
func TestMutualTLS(t *testing.T) {
	launch.CheckGoroutines(t)
	bs := startBackends(t, 1)
	trusted, other := newCA(t, "gateways"), newCA(t, "someone else")
	bundle := newSecretDir(t, map[string][]byte{tlsutil.CAFile: trusted.PEM()})
	p := startEPP(t, launch.EPPOptions{Endpoints: addrs(bs), TLS: true, Args: []string{"--client-ca=" + bundle.path(tlsutil.CAFile)}})

	tests := []struct {
		name   string
		cert   *tls.Certificate
		served bool
	}{
		{name: "no certificate"},
		{name: "certificate from another CA", cert: issueClient(t, other, "intruder")},
		{name: "certificate from the client CA", cert: issueClient(t, trusted, "envoy"), served: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := probeTLS(p.GRPCAddr, gatewayTLS(tc.cert))
			if tc.served != (err == nil) {
				t.Fatalf("handshake error %v, want served=%v", err, tc.served)
			}
			if !tc.served {
				return
			}
			if err := healthOver(dialGateway(t, p.GRPCAddr, gatewayTLS(tc.cert))); err != nil {
				t.Fatalf("health over mutual TLS: %v", err)
			}
		})
	}
}

// TestTLSReload: replacing the serving key pair (--cert-path) and the
// client CA bundle (--client-ca) on disk, as a Secret update does, changes
// what new connections see without a restart, while a connection opened
// before keeps working.
func TestTLSReload(t *testing.T) {
	launch.CheckGoroutines(t)
	bs := startBackends(t, 1)
	serving, oldGW, newGW := newCA(t, "serving"), newCA(t, "gateways 2024"), newCA(t, "gateways 2025")
	first, second := issueServer(t, serving, "epp-1"), issueServer(t, serving, "epp-2")
	pair := newSecretDir(t, pairFiles(t, first))
	bundle := newSecretDir(t, map[string][]byte{tlsutil.CAFile: oldGW.PEM()})
	p := startEPP(t, launch.EPPOptions{Endpoints: addrs(bs), TLS: true, Args: []string{
		"--cert-path=" + pair.dir, "--client-ca=" + bundle.path(tlsutil.CAFile),
	}})
	oldCert, newCert := issueClient(t, oldGW, "envoy-old"), issueClient(t, newGW, "envoy-new")

	serial := func(cert *tls.Certificate) string {
		t.Helper()
		s, err := probeTLS(p.GRPCAddr, gatewayTLS(cert))
		if err != nil {
			t.Fatalf("handshake: %v", err)
		}
		return s
	}
	if got := serial(oldCert); got != first.Leaf.SerialNumber.String() {
		t.Fatalf("picker serves certificate %s, want --cert-path's %s", got, first.Leaf.SerialNumber)
	}
	if _, err := probeTLS(p.GRPCAddr, gatewayTLS(newCert)); err == nil {
		t.Fatal("a certificate from a CA not yet in the bundle was accepted")
	}
	established := dialGateway(t, p.GRPCAddr, gatewayTLS(oldCert))
	if err := healthOver(established); err != nil {
		t.Fatalf("health before the rotation: %v", err)
	}

	pair.update(pairFiles(t, second))
	launch.WaitFor(t, func() string { return "new connections still get the first serving certificate" }, func() bool {
		return serial(oldCert) == second.Leaf.SerialNumber.String()
	})

	bundle.update(map[string][]byte{tlsutil.CAFile: newGW.PEM()})
	launch.WaitFor(t, func() string { return "a client certificate from the new CA is still refused" }, func() bool {
		_, err := probeTLS(p.GRPCAddr, gatewayTLS(newCert))
		return err == nil
	})
	if _, err := probeTLS(p.GRPCAddr, gatewayTLS(oldCert)); err == nil {
		t.Error("a certificate from the CA removed from the bundle is still accepted on a new connection")
	}
	if err := healthOver(established); err != nil {
		t.Errorf("the connection established before the rotation: %v", err)
	}
	if err := healthOver(dialGateway(t, p.GRPCAddr, gatewayTLS(newCert))); err != nil {
		t.Errorf("health over a new connection with the new CA's certificate: %v", err)
	}
	verifying := gatewayTLS(newCert)
	verifying.InsecureSkipVerify = false
	verifying.RootCAs = serving.Pool()
	verifying.ServerName = "localhost"
	if _, err := probeTLS(p.GRPCAddr, verifying); err != nil {
		t.Errorf("a gateway verifying the picker against the serving CA: %v", err)
	}
}
