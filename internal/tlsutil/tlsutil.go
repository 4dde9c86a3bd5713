package tlsutil

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// File names inside a certificate directory, as in a Kubernetes TLS secret.
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
)

// validity is how long every certificate made here is valid: these are
// in-memory or test certificates, and an expiry in the middle of a long run
// would be a false alarm.
const validity = 10 * 365 * 24 * time.Hour

// SelfSigned returns a new self-signed ECDSA P-256 certificate valid for ten
// years for the given DNS names or IP addresses (plus localhost and the
// loopback addresses). It exists only in memory.
func SelfSigned(hosts ...string) (tls.Certificate, error) {
	tmpl := template("laneway-epp", hosts)
	tmpl.KeyUsage |= x509.KeyUsageCertSign
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	tmpl.IsCA = true
	return create(tmpl, nil)
}

// template is the certificate template every certificate here starts
// from: CommonName name, valid for localhost, the loopback addresses and
// hosts (DNS names or IP addresses).
func template(name string, hosts []string) *x509.Certificate {
	now := time.Now()
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{Organization: []string{"laneway"}, CommonName: name},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return tmpl
}

// create makes a certificate from tmpl with a new ECDSA P-256 key, signed
// by parent (nil: self-signed).
func create(tmpl *x509.Certificate, parent *tls.Certificate) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate key: %w", err)
	}
	if tmpl.SerialNumber, err = rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126)); err != nil {
		return tls.Certificate{}, fmt.Errorf("generate serial: %w", err)
	}
	issuer, signer := tmpl, crypto.Signer(key)
	if parent != nil {
		issuer = parent.Leaf
		var ok bool
		if signer, ok = parent.PrivateKey.(crypto.Signer); !ok {
			return tls.Certificate{}, fmt.Errorf("issuer %q: key of type %T cannot sign", parent.Leaf.Subject.CommonName, parent.PrivateKey)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, &key.PublicKey, signer)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("create certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("parse certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// CA is a certificate authority that exists only in memory: what a test,
// or an operator trying mutual TLS out locally, needs to issue a picker's
// serving certificate and its gateways' client certificates, and to write
// the bundle --client-ca reads.
type CA struct {
	// Cert is the CA's own certificate (Leaf parsed) and key.
	Cert tls.Certificate
}

// NewCA returns a new CA named name, valid for ten years.
func NewCA(name string) (*CA, error) {
	tmpl := template(name, nil)
	tmpl.DNSNames, tmpl.IPAddresses = nil, nil
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	tmpl.IsCA = true
	cert, err := create(tmpl, nil)
	if err != nil {
		return nil, fmt.Errorf("CA %q: %w", name, err)
	}
	return &CA{Cert: cert}, nil
}

// Server issues a serving certificate for localhost, the loopback
// addresses and hosts.
func (ca *CA) Server(name string, hosts ...string) (tls.Certificate, error) {
	tmpl := template(name, hosts)
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	return ca.issue(tmpl)
}

// Replica issues a picker replica's certificate for both ends of a TLS
// connection: a replica identity (--replica-cert-path), which a leader
// serves its replica link with and a follower presents to it.
func (ca *CA) Replica(name string, hosts ...string) (tls.Certificate, error) {
	tmpl := template(name, hosts)
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	return ca.issue(tmpl)
}

// Client issues a client certificate with CommonName name, as a gateway
// presents to a picker run with --client-ca.
func (ca *CA) Client(name string) (tls.Certificate, error) {
	tmpl := template(name, nil)
	tmpl.DNSNames, tmpl.IPAddresses = nil, nil
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return ca.issue(tmpl)
}

// WriteReplica issues a replica certificate (Replica) named name and
// writes it with the CA into dir as a replica identity folder
// (--replica-cert-path): tls.crt, tls.key and ca.crt.
func (ca *CA) WriteReplica(dir, name string) error {
	cert, err := ca.Replica(name)
	if err != nil {
		return err
	}
	certPEM, keyPEM, err := EncodePEM(cert)
	if err != nil {
		return err
	}
	for file, data := range map[string][]byte{CertFile: certPEM, KeyFile: keyPEM, CAFile: ca.PEM()} {
		if err := os.WriteFile(filepath.Join(dir, file), data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

func (ca *CA) issue(tmpl *x509.Certificate) (tls.Certificate, error) {
	cert, err := create(tmpl, &ca.Cert)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("CA %q: %w", ca.Cert.Leaf.Subject.CommonName, err)
	}
	return cert, nil
}

// PEM returns the CA's certificate in PEM, the format of a ca.crt bundle.
func (ca *CA) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Certificate[0]})
}

// Pool returns a pool holding only the CA, for a peer that verifies
// certificates it issued.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert.Leaf)
	return p
}

// ServerConfig returns a TLS 1.2+ server configuration offering ALPN h2, as
// gRPC needs, with certificates from getCert (for example
// (*Reloader).GetCertificate, or Static).
func ServerConfig(getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)) *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		NextProtos:     []string{"h2"},
		GetCertificate: getCert,
	}
}

// MutualServerConfig is ServerConfig that also requires every client to
// present a certificate that verifies against clientCAs, asked for at each
// handshake (for example (*CAReloader).Pool): a rotated bundle applies to
// the next connection, and connections already established keep the
// verification they passed.
func MutualServerConfig(getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error), clientCAs func() *x509.CertPool) *tls.Config {
	base := ServerConfig(getCert)
	base.ClientAuth = tls.RequireAndVerifyClientCert
	cfg := base.Clone()
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := base.Clone()
		c.ClientCAs = clientCAs()
		return c, nil
	}
	return cfg
}

// Static returns a GetCertificate function that always serves cert.
func Static(cert tls.Certificate) func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &cert, nil }
}

// ClientConfig returns a TLS client configuration with ALPN h2. With
// insecureSkipVerify the server certificate is not checked, which is only
// right for a picker serving its self-signed certificate on a trusted path.
func ClientConfig(insecureSkipVerify bool) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		NextProtos:         []string{"h2"},
		InsecureSkipVerify: insecureSkipVerify, //nolint:gosec // opt-in, documented above
	}
}

// EncodePEM returns a certificate chain and its private key in PEM, the
// format of tls.crt and tls.key.
func EncodePEM(cert tls.Certificate) (certPEM, keyPEM []byte, err error) {
	for _, der := range cert.Certificate {
		certPEM = append(certPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	der, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		return nil, nil, fmt.Errorf("marshal private key: %w", err)
	}
	return certPEM, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}
