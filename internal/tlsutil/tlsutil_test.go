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
	r, err := NewReloader(dir, nil)
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
	if _, err := NewReloader(t.TempDir(), nil); err == nil {
		t.Error("NewReloader on an empty directory succeeded")
	}
}

func TestMutualServerConfig(t *testing.T) {
	trusted, err := NewCA("trusted")
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewCA("other")
	if err != nil {
		t.Fatal(err)
	}
	serving, err := trusted.Server("picker")
	if err != nil {
		t.Fatal(err)
	}
	good, err := trusted.Client("gateway")
	if err != nil {
		t.Fatal(err)
	}
	bad, err := other.Client("gateway")
	if err != nil {
		t.Fatal(err)
	}
	misused, err := trusted.Server("not-a-client")
	if err != nil {
		t.Fatal(err)
	}
	srv := MutualServerConfig(Static(serving), trusted.Pool)
	tests := []struct {
		name    string
		certs   []tls.Certificate
		wantErr bool
	}{
		{name: "client certificate from the CA", certs: []tls.Certificate{good}},
		{name: "no client certificate", wantErr: true},
		{name: "client certificate from another CA", certs: []tls.Certificate{bad}, wantErr: true},
		{name: "server-only certificate as a client's", certs: []tls.Certificate{misused}, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cli := ClientConfig(false)
			cli.RootCAs = trusted.Pool()
			cli.ServerName = "localhost"
			cli.Certificates = tc.certs
			err := mutualHandshake(t, srv, cli)
			if (err != nil) != tc.wantErr {
				t.Fatalf("handshake error %v, want error %v", err, tc.wantErr)
			}
		})
	}
}

// mutualHandshake is handshake for a server that judges the client: with
// TLS 1.3 the client's handshake returns before the server has checked
// the client certificate, so the verdict is what the server's side
// returns.
func mutualHandshake(t *testing.T, srv, cli *tls.Config) error {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", srv)
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer lis.Close()
	verdict := make(chan error, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			verdict <- err
			return
		}
		defer c.Close()
		verdict <- c.(*tls.Conn).Handshake()
	}()
	c, err := tls.Dial("tcp", lis.Addr().String(), cli)
	if err == nil {
		defer c.Close()
	}
	if serr := <-verdict; serr != nil {
		return serr
	}
	return err
}

// swapFile replaces path with a new file holding data, as a Kubernetes
// volume update or an editor's save does: a new inode renamed over the
// old one, here with the old modification time and the same size, so
// only the file's identity tells the two apart.
func swapFile(t *testing.T, path string, data []byte) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(tmp, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestCAReloader(t *testing.T) {
	first, err := NewCA("ca-one")
	if err != nil {
		t.Fatal(err)
	}
	// A second CA of the same PEM size (signatures vary by a few bytes),
	// so that only the file's identity tells the two files apart.
	var second *CA
	for range 50 {
		if second, err = NewCA("ca-two"); err != nil {
			t.Fatal(err)
		}
		if len(second.PEM()) == len(first.PEM()) {
			break
		}
	}
	path := filepath.Join(t.TempDir(), CAFile)
	if err := os.WriteFile(path, first.PEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	var reloads []error
	r, err := NewCAReloader(path, func(err error) { reloads = append(reloads, err) })
	if err != nil {
		t.Fatalf("NewCAReloader: %v", err)
	}
	trusts := func(ca *CA) bool {
		_, err := ca.Cert.Leaf.Verify(x509.VerifyOptions{Roots: r.Pool()})
		return err == nil
	}
	if !trusts(first) || trusts(second) {
		t.Fatalf("initial bundle: trusts first %v, second %v; want only first", trusts(first), trusts(second))
	}
	if len(reloads) != 0 {
		t.Errorf("the initial load was reported as a reload: %v", reloads)
	}

	if len(first.PEM()) != len(second.PEM()) {
		t.Fatalf("no second CA of the first's PEM size (%d bytes) in 50 tries", len(first.PEM()))
	}
	swapFile(t, path, second.PEM())
	if !trusts(second) || trusts(first) {
		t.Errorf("after the swap: trusts first %v, second %v; want only second", trusts(first), trusts(second))
	}
	if len(reloads) != 1 || reloads[0] != nil {
		t.Errorf("reloads %v, want one successful", reloads)
	}

	swapFile(t, path, []byte("-----BEGIN NOTHING-----\n"))
	for range 2 {
		if !trusts(second) {
			t.Error("a broken bundle replaced the last good one")
		}
	}
	if r.LastError() == nil || len(reloads) != 2 || reloads[1] == nil {
		t.Errorf("broken bundle: LastError %v, reloads %v; want the error reported once", r.LastError(), reloads)
	}

	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{filepath.Join(t.TempDir(), "missing"), empty, path} {
		if _, err := NewCAReloader(bad, nil); err == nil {
			t.Errorf("NewCAReloader(%s) succeeded without a certificate", bad)
		}
	}
}
