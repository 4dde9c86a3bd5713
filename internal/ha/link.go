package ha

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/laneway-dev/laneway/internal/tlsutil"
)

// LinkOptions are the leader link's transport: the one the gateways use to
// reach the leader's ext_proc port, and how a follower trusts the leader
// on it (leaderTLS).
type LinkOptions struct {
	// TLS dials with TLS (--secure-serving); false, plaintext.
	TLS bool
	// CertPath is the mounted serving pair (--cert-path; "": self-signed).
	CertPath string
	// MutualTLS says the replicas require client certificates
	// (--client-ca): a follower presents its CertPath pair.
	MutualTLS bool
	// Insecure skips verifying the leader (--leader-tls-insecure).
	Insecure bool
	// MaxBodyBytes is the largest request body (--max-body-bytes); a
	// message may be up to 1 MiB larger.
	MaxBodyBytes int
}

// dialer returns the function that connects to a leader named by its
// holder identity, over the transport the gateways use: plaintext, or TLS
// verified as leaderTLS says.
func dialer(link LinkOptions) func(holder string) (*grpc.ClientConn, error) {
	return func(holder string) (*grpc.ClientConn, error) {
		addr, tag, ok := parseHolder(holder)
		if !ok {
			return nil, fmt.Errorf("lease holder %q names no address", holder)
		}
		creds := insecure.NewCredentials()
		if link.TLS {
			cfg, err := leaderTLS(link, tag)
			if err != nil {
				return nil, err
			}
			creds = credentials.NewTLS(cfg)
		}
		conn, err := grpc.NewClient(addr,
			grpc.WithTransportCredentials(creds),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(link.MaxBodyBytes+(1<<20)), grpc.MaxCallSendMsgSize(link.MaxBodyBytes+(1<<20))),
			// The leader's enforcement allows pings every 5 s, also without
			// streams: a dead leader is noticed within about 15 s even on
			// an idle link, and streams go local meanwhile only once the
			// connection is down.
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

// leaderTLS is the TLS client config of the leader link. With --client-ca
// the follower presents its --cert-path pair as its client certificate.
// The leader serves what the gateways see, so the follower trusts it as
// follows:
//
//   - --leader-tls-insecure: no verification;
//   - without --cert-path the leader's certificate is self-signed, made at
//     its start; its holder identity on the Lease carries the
//     certificate's SHA-256 pin (tag), and only that certificate is
//     accepted. The Lease is as trusted as the picker's RBAC makes it;
//   - with --cert-path every replica mounts the same Secret: the chain must
//     verify against its ca.crt when the folder has one, else against the
//     certificate in tls.crt itself. The host name is not checked (the
//     leader is dialled by pod IP, which a Service's certificate does not
//     name), so the CA should be one that signs only the picker's
//     certificates.
func leaderTLS(link LinkOptions, tag string) (*tls.Config, error) {
	cfg := tlsutil.ClientConfig(true)
	if link.MutualTLS {
		// The leader requires a client certificate of its gateways and of
		// its followers alike: a follower presents its own serving pair,
		// reloaded as the server's is, so a rotated Secret is used at the
		// next handshake (Validate requires --cert-path with --client-ca
		// and leader election).
		pair, err := tlsutil.NewReloader(link.CertPath, nil)
		if err != nil {
			return nil, fmt.Errorf("--cert-path: the leader link's client certificate: %w", err)
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return pair.GetCertificate(nil) }
	}
	switch {
	case link.Insecure:
		return cfg, nil
	case link.CertPath == "":
		if !isPin(tag) {
			return nil, fmt.Errorf("the leader's identity carries no certificate pin (%q): is it serving with --cert-path while this replica is not?", tag)
		}
		cfg.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 || certPin(raw[0]) != tag {
				return errors.New("the leader's certificate does not match the pin on the Lease")
			}
			return nil
		}
		return cfg, nil
	}
	// ca.crt when the folder has one, else tls.crt; reloaded when it
	// changes, like the server's client CA bundle.
	caPath := filepath.Join(link.CertPath, tlsutil.CAFile)
	if _, err := os.Stat(caPath); errors.Is(err, os.ErrNotExist) {
		caPath = filepath.Join(link.CertPath, tlsutil.CertFile)
	}
	roots, err := tlsutil.NewCAReloader(caPath, nil)
	if err != nil {
		return nil, fmt.Errorf("--cert-path: the leader link's CA: %w", err)
	}
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("the leader sent no certificate")
		}
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots.Pool(), Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		if err != nil {
			return fmt.Errorf("verify the leader's certificate against --cert-path: %w", err)
		}
		return nil
	}
	return cfg, nil
}

// certPin is the pin of a DER certificate: the first 16 bytes of its
// SHA-256, in hex.
func certPin(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:16])
}

func isPin(tag string) bool {
	if len(tag) != 32 {
		return false
	}
	_, err := hex.DecodeString(tag)
	return err == nil
}

// ServingPin returns the pin of the self-signed certificate the ext_proc
// server serves with serving (its holder identity's tag, so followers
// trust exactly that certificate); "" when it serves plaintext (nil) or a
// mounted certificate (link.CertPath), which can change while the
// identity cannot.
func ServingPin(link LinkOptions, serving *tls.Config) string {
	if serving == nil || link.CertPath != "" || serving.GetCertificate == nil {
		return ""
	}
	c, err := serving.GetCertificate(&tls.ClientHelloInfo{})
	if err != nil || c == nil || len(c.Certificate) == 0 {
		return ""
	}
	return certPin(c.Certificate[0])
}
