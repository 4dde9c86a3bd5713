package ha

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/internal/tlsutil"
)

// TestLeaderTLSReloadsTheCA: the leader link's CA is read again when the
// mounted file changes (a rotated Secret swaps it), without a new dial: a
// leader signed by the new CA is refused before the swap and accepted
// after it, on the same config.
func TestLeaderTLSReloadsTheCA(t *testing.T) {
	dir, next := t.TempDir(), t.TempDir()
	writeCA(t, dir, true)
	rotated := writeCA(t, next, true)
	cfg, err := leaderTLS(LinkOptions{TLS: true, CertPath: dir}, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake(t, cfg, rotated); err == nil {
		t.Fatal("a leader signed by a CA not yet mounted was accepted")
	}
	data, err := os.ReadFile(filepath.Join(next, tlsutil.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, ".ca.tmp") // a new file swapped in, as the kubelet's symlink swap does
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, tlsutil.CAFile)); err != nil {
		t.Fatal(err)
	}
	if err := handshake(t, cfg, rotated); err != nil {
		t.Fatalf("after the CA rotated, its leader is refused: %v", err)
	}
}

// writeCA writes a CA and a leaf it signs into dir as tls.crt/tls.key and,
// when withCA, ca.crt.
func writeCA(t *testing.T, dir string, withCA bool) (leaf tls.Certificate) {
	t.Helper()
	ca, err := tlsutil.SelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	leaf = signedLeaf(t, ca)
	certPEM, keyPEM, err := tlsutil.EncodePEM(leaf)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, _, err := tlsutil.EncodePEM(ca)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{tlsutil.CertFile: certPEM, tlsutil.KeyFile: keyPEM}
	if withCA {
		files["ca.crt"] = caPEM
	} else {
		files[tlsutil.CertFile] = append(certPEM, caPEM...)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return leaf
}

// TestLeaderTLS: a follower accepts the leader it is told to trust and
// no other: the pinned self-signed certificate without --cert-path, the
// chain to --cert-path's CA with it, anything with --leader-tls-insecure.
func TestLeaderTLS(t *testing.T) {
	selfA, err := tlsutil.SelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	selfB, err := tlsutil.SelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	withCA, bundle, other := t.TempDir(), t.TempDir(), t.TempDir()
	leafCA := writeCA(t, withCA, true)
	leafBundle := writeCA(t, bundle, false)
	writeCA(t, other, true)
	pinA := certPin(selfA.Certificate[0])

	tests := []struct {
		name     string
		link     LinkOptions
		tag      string
		serve    tls.Certificate
		wantErr  string // from leaderTLS
		accepted bool
	}{
		{name: "pinned self-signed", tag: pinA, serve: selfA, accepted: true},
		{name: "another self-signed", tag: pinA, serve: selfB},
		{name: "no pin on the Lease", tag: "0123456789abcdef", serve: selfA, wantErr: "no certificate pin"},
		{name: "ca.crt of --cert-path", link: LinkOptions{CertPath: withCA}, serve: leafCA, accepted: true},
		{name: "tls.crt chain of --cert-path", link: LinkOptions{CertPath: bundle}, serve: leafBundle, accepted: true},
		{name: "a leaf of another CA", link: LinkOptions{CertPath: other}, serve: leafCA},
		{name: "insecure takes anything", link: LinkOptions{CertPath: other, Insecure: true}, serve: selfB, accepted: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			link := tt.link
			link.TLS = true
			cfg, err := leaderTLS(link, tt.tag)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("leaderTLS = %v, want an error with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := handshake(t, cfg, tt.serve); (err == nil) != tt.accepted {
				t.Errorf("handshake: %v, want accepted %v", err, tt.accepted)
			}
		})
	}
}

// handshake serves cert on loopback and dials it with cfg.
func handshake(t *testing.T, cfg *tls.Config, cert tls.Certificate) error {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", tlsutil.ServerConfig(tlsutil.Static(cert)))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", ln.Addr().String(), cfg)
	if err == nil {
		c.Close()
	}
	return err
}

// signedLeaf is a server certificate for laneway-epp.ns.svc signed by ca.
func signedLeaf(t *testing.T, ca tls.Certificate) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "laneway-epp"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"laneway-epp.ns.svc"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Leaf, &key.PublicKey, ca.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestLeaderTLSPresentsClientCertificate: with --client-ca the leader
// requires a client certificate of everyone, its followers included; a
// follower presents its --cert-path pair (here signed by the CA the leader
// trusts) and gets in, one without --client-ca set presents nothing and is
// refused.
func TestLeaderTLSPresentsClientCertificate(t *testing.T) {
	ca, err := tlsutil.NewCA("laneway replicas")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Replica("laneway-epp")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := tlsutil.EncodePEM(leaf)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, data := range map[string][]byte{tlsutil.CertFile: certPEM, tlsutil.KeyFile: keyPEM, "ca.crt": ca.PEM()} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pool := ca.Pool()
	serve := func(cfg *tls.Config) error {
		t.Helper()
		ln, err := tls.Listen("tcp", "127.0.0.1:0", tlsutil.MutualServerConfig(tlsutil.Static(leaf), func() *x509.CertPool { return pool }))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		accepted := make(chan error, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				accepted <- err
				return
			}
			accepted <- c.(*tls.Conn).Handshake()
			c.Close()
		}()
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), cfg)
		if err == nil {
			c.Close()
		}
		return <-accepted // the leader's verdict on the follower
	}
	for _, tc := range []struct {
		name     string
		clientCA string
		accepted bool
	}{{"with --client-ca", filepath.Join(dir, "ca.crt"), true}, {"without", "", false}} {
		cfg, err := leaderTLS(LinkOptions{TLS: true, CertPath: dir, MutualTLS: tc.clientCA != ""}, "")
		if err != nil {
			t.Fatal(err)
		}
		if err := serve(cfg); (err == nil) != tc.accepted {
			t.Errorf("%s: the leader's handshake %v, want accepted %v", tc.name, err, tc.accepted)
		}
	}
}
