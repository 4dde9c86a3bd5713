package tlsutil

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// handshake serves one TLS connection with srv and dials it with cli,
// returning the client's view of the connection.
func handshake(t *testing.T, srv, cli *tls.Config) (tls.ConnectionState, error) {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", srv)
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer lis.Close()
	go func() {
		c, err := lis.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.(*tls.Conn).Handshake()
	}()
	c, err := tls.Dial("tcp", lis.Addr().String(), cli)
	if err != nil {
		return tls.ConnectionState{}, err
	}
	defer c.Close()
	return c.ConnectionState(), nil
}

func TestSelfSignedHandshake(t *testing.T) {
	cert, err := SelfSigned("epp.example.internal", "10.1.2.3")
	if err != nil {
		t.Fatalf("SelfSigned: %v", err)
	}
	if got := cert.Leaf.DNSNames; len(got) != 2 || got[1] != "epp.example.internal" {
		t.Errorf("DNS names %v", got)
	}
	if len(cert.Leaf.IPAddresses) != 3 || !cert.Leaf.IPAddresses[2].Equal(net.ParseIP("10.1.2.3")) {
		t.Errorf("IP addresses %v", cert.Leaf.IPAddresses)
	}
	roots := x509.NewCertPool()
	roots.AddCert(cert.Leaf)
	verifying := ClientConfig(false)
	verifying.RootCAs = roots
	tests := []struct {
		name    string
		cli     *tls.Config
		wantErr bool
	}{
		{name: "trusted root", cli: verifying},
		{name: "skip verify", cli: ClientConfig(true)},
		{name: "unknown authority", cli: ClientConfig(false), wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, err := handshake(t, ServerConfig(Static(cert)), tc.cli)
			if (err != nil) != tc.wantErr {
				t.Fatalf("handshake error %v, want error %v", err, tc.wantErr)
			}
			if err == nil && st.NegotiatedProtocol != "h2" {
				t.Errorf("ALPN %q, want h2", st.NegotiatedProtocol)
			}
		})
	}
}

// writePair writes a fresh self-signed pair into dir with the given
// modification time (set explicitly: two writes within one clock tick must
// still look different).
func writePair(t *testing.T, dir string, mod time.Time) *x509.Certificate {
	t.Helper()
	cert, err := SelfSigned()
	if err != nil {
		t.Fatalf("SelfSigned: %v", err)
	}
	c, k, err := EncodePEM(cert)
	if err != nil {
		t.Fatalf("EncodePEM: %v", err)
	}
	for name, data := range map[string][]byte{CertFile: c, KeyFile: k} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatalf("write %s: %v", name, err)
		}
		if err := os.Chtimes(p, mod, mod); err != nil {
			t.Fatalf("chtimes %s: %v", name, err)
		}
	}
	return cert.Leaf
}

func TestReloader(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Now().Add(-time.Hour)
	first := writePair(t, dir, t0)
	r, err := NewReloader(dir)
	if err != nil {
		t.Fatalf("NewReloader: %v", err)
	}
	serial := func() string {
		c, err := r.GetCertificate(nil)
		if err != nil {
			t.Fatalf("GetCertificate: %v", err)
		}
		leaf, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatalf("parse served certificate: %v", err)
		}
		return leaf.SerialNumber.String()
	}
	if got := serial(); got != first.SerialNumber.String() {
		t.Fatalf("serving %s, want the first pair %s", got, first.SerialNumber)
	}
	second := writePair(t, dir, t0.Add(time.Minute))
	if got := serial(); got != second.SerialNumber.String() {
		t.Errorf("after rotation serving %s, want %s", got, second.SerialNumber)
	}
	if err := r.LastError(); err != nil {
		t.Errorf("LastError after a good reload: %v", err)
	}
	// A broken key file keeps the last good pair in service.
	kp := filepath.Join(dir, KeyFile)
	if err := os.WriteFile(kp, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := serial(); got != second.SerialNumber.String() {
		t.Errorf("after a broken update serving %s, want the last good %s", got, second.SerialNumber)
	}
	if r.LastError() == nil {
		t.Error("LastError is nil after a broken update")
	}
	if _, err := NewReloader(t.TempDir()); err == nil {
		t.Error("NewReloader on an empty directory succeeded")
	}
}
