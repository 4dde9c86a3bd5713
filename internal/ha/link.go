package ha

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/laneway-dev/laneway/internal/tlsutil"
)

// PeerTLS is the replica identity (--replica-cert-path): a key pair and
// the CA that signs every replica of the pool (tls.crt, tls.key and
// ca.crt in one folder, a mounted Secret), each reloaded at the next
// handshake after its file changed. The replica link is mutual TLS with
// it both ways: a leader serves the link with the pair and accepts only
// followers presenting a certificate the CA signed; a follower presents
// the pair and accepts only a leader the CA signed. Host names are not
// checked (a leader is dialled by pod IP): the CA must sign nothing but
// the pool's replicas, which is what the chart's own CA (or cert-manager
// Issuer) does.
type PeerTLS struct {
	pair *tlsutil.Reloader
	ca   *tlsutil.CAReloader
}

// LoadPeerTLS reads the replica identity in dir.
func LoadPeerTLS(dir string, log logr.Logger) (*PeerTLS, error) {
	onReload := func(what string) func(error) {
		return func(err error) {
			if err != nil {
				log.Error(err, "replica "+what+" not reloaded; the previous one stays in use", "path", dir)
				return
			}
			log.Info("replica "+what+" reloaded", "path", dir)
		}
	}
	pair, err := tlsutil.NewReloader(dir, onReload("certificate"))
	if err != nil {
		return nil, fmt.Errorf("--replica-cert-path: %w", err)
	}
	ca, err := tlsutil.NewCAReloader(filepath.Join(dir, tlsutil.CAFile), onReload("CA"))
	if err != nil {
		return nil, fmt.Errorf("--replica-cert-path: the replicas' CA: %w", err)
	}
	return &PeerTLS{pair: pair, ca: ca}, nil
}

// Server is the leader's TLS config for the link's listener: the client
// certificate is required and must verify against the replicas' CA.
func (p *PeerTLS) Server() *tls.Config {
	return tlsutil.MutualServerConfig(p.pair.GetCertificate, p.ca.Pool)
}

// Client is a follower's TLS config for dialling a leader.
func (p *PeerTLS) Client() *tls.Config {
	cfg := tlsutil.ClientConfig(true) // verified below, against the CA only
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return p.pair.GetCertificate(nil) }
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if err := p.verify(cs.PeerCertificates, x509.ExtKeyUsageServerAuth); err != nil {
			return fmt.Errorf("the leader is not a replica of this pool: %w", err)
		}
		return nil
	}
	return cfg
}

// IsPeer reports whether a TLS peer's certificates (the leaf first) are a
// replica's, as a client: signed by the replicas' CA.
func (p *PeerTLS) IsPeer(certs []*x509.Certificate) bool {
	return p != nil && p.verify(certs, x509.ExtKeyUsageClientAuth) == nil
}

func (p *PeerTLS) verify(certs []*x509.Certificate, usage x509.ExtKeyUsage) error {
	if len(certs) == 0 {
		return errors.New("no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, err := certs[0].Verify(x509.VerifyOptions{Roots: p.ca.Pool(), Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}})
	return err
}

// ServerOptions are the gRPC options of the link's server: mutual TLS with
// the replica identity, and keepalive pings that end the link of a
// follower that went silent (a cut network, a frozen node) within about
// 15 s, so its grants are given back.
func (p *PeerTLS) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.Creds(credentials.NewTLS(p.Server())),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 10 * time.Second, Timeout: 5 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.InitialWindowSize(1 << 20), grpc.InitialConnWindowSize(1 << 24),
		grpc.MaxRecvMsgSize(maxFrameBytes),
	}
}

// maxFrameBytes bounds one frame of the link either way: a sender splits
// larger batches.
const maxFrameBytes = 16 << 20

// dialer returns the function that connects to a leader named by its
// holder identity, over mutual TLS with the replica identity.
func (p *PeerTLS) dialer() func(holder string) (*grpc.ClientConn, error) {
	return func(holder string) (*grpc.ClientConn, error) {
		addr, _, ok := parseHolder(holder)
		if !ok {
			return nil, fmt.Errorf("lease holder %q names no address", holder)
		}
		conn, err := grpc.NewClient(addr,
			grpc.WithTransportCredentials(credentials.NewTLS(p.Client())),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxFrameBytes), grpc.MaxCallSendMsgSize(maxFrameBytes)),
			// A dead leader is noticed within about 15 s even when no
			// ticket is waiting (the server allows pings every 5 s).
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
			grpc.WithIdleTimeout(0),
			grpc.WithInitialWindowSize(1<<20), grpc.WithInitialConnWindowSize(1<<24),
		)
		if err != nil {
			return nil, fmt.Errorf("connect to the leader at %s: %w", addr, err)
		}
		conn.Connect()
		return conn, nil
	}
}
