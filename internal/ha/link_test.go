package ha

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/laneway-dev/laneway/internal/tlsutil"
)

// replicaDir writes a replica identity issued by ca into a new folder and
// loads it.
func replicaDir(t testing.TB, ca *tlsutil.CA) (string, *PeerTLS) {
	t.Helper()
	dir := t.TempDir()
	if err := ca.WriteReplica(dir, "laneway-epp"); err != nil {
		t.Fatal(err)
	}
	p, err := LoadPeerTLS(dir, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	return dir, p
}

func newCA(t testing.TB, name string) *tlsutil.CA {
	t.Helper()
	ca, err := tlsutil.NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// TestPeerTLS: the link is mutual TLS with the replica identity, both
// ways: a leader accepts a follower of its pool's CA only, a follower a
// leader of it only; and a client that presents no certificate (a
// gateway dialling the link's port) is refused.
func TestPeerTLS(t *testing.T) {
	pool, other := newCA(t, "pool replicas"), newCA(t, "another pool")
	_, a := replicaDir(t, pool)
	_, b := replicaDir(t, pool)
	_, stranger := replicaDir(t, other)
	noCert := tlsutil.ClientConfig(true)
	for _, tc := range []struct {
		name     string
		leader   *PeerTLS
		client   *tls.Config
		accepted bool
	}{
		{"two replicas of the pool", a, b.Client(), true},
		{"a follower of another CA", a, stranger.Client(), false},
		{"a leader of another CA", stranger, a.Client(), false},
		{"a client without a certificate", a, noCert, false},
	} {
		if err := handshake(t, tc.leader.Server(), tc.client); (err == nil) != tc.accepted {
			t.Errorf("%s: handshake %v, want accepted %v", tc.name, err, tc.accepted)
		}
	}
	// IsPeer, the forwarded marker's check, on the certificates a server
	// sees.
	leaf, err := other.Client("gateway")
	if err != nil {
		t.Fatal(err)
	}
	if a.IsPeer([]*x509.Certificate{leaf.Leaf}) {
		t.Error("a gateway's client certificate of another CA counts as a replica")
	}
	mine, err := pool.Replica("peer")
	if err != nil {
		t.Fatal(err)
	}
	if !a.IsPeer([]*x509.Certificate{mine.Leaf}) {
		t.Error("a replica certificate of the pool's CA does not count as a replica")
	}
	if (*PeerTLS)(nil).IsPeer([]*x509.Certificate{mine.Leaf}) {
		t.Error("without a replica identity, a certificate counts as a replica")
	}
}

// TestPeerTLSReloadsTheCA: the replicas' CA is read again when the
// mounted file changes (a rotated Secret swaps it), without a new config:
// a leader signed by the new CA is refused before the swap and accepted
// after it.
func TestPeerTLSReloadsTheCA(t *testing.T) {
	old, next := newCA(t, "old"), newCA(t, "next")
	dir, follower := replicaDir(t, old)
	_, leader := replicaDir(t, next)
	cfg := follower.Client()
	server := tlsutil.ServerConfig(leader.pair.GetCertificate) // the leader's check of the follower is not this test's
	if err := handshake(t, server, cfg); err == nil {
		t.Fatal("a leader signed by a CA not yet mounted was accepted")
	}
	tmp := filepath.Join(dir, ".ca.tmp") // a new file swapped in, as the kubelet's symlink swap does
	if err := os.WriteFile(tmp, next.PEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, tlsutil.CAFile)); err != nil {
		t.Fatal(err)
	}
	if err := handshake(t, server, cfg); err != nil {
		t.Fatalf("after the CA rotated, its leader is refused: %v", err)
	}
}

// handshake serves with server on loopback, dials with client, and
// returns the first error of either side.
func handshake(t *testing.T, server, client *tls.Config) error {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", server)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		served <- c.(*tls.Conn).Handshake()
		c.Close()
	}()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), client)
	if err == nil {
		// TLS 1.3: the client's handshake ends before the server checked
		// the client's certificate; a read learns the verdict.
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			err = nil
		}
		c.Close()
	}
	if serr := <-served; serr != nil {
		return serr
	}
	if err != nil && err.Error() != "EOF" {
		return err
	}
	return nil
}
