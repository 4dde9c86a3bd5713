package tlsutil

import (
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
	"sync"
	"time"
)

// File names inside a certificate directory, as in a Kubernetes TLS secret.
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
)

// SelfSigned returns a new self-signed ECDSA P-256 certificate valid for ten
// years for the given DNS names or IP addresses (plus localhost and the
// loopback addresses). It exists only in memory.
func SelfSigned(hosts ...string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"laneway"}, CommonName: "laneway-epp"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
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
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("create certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("parse certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
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

// Reloader serves the key pair in a directory and reloads it when either
// file's modification time or size changes. A failed reload keeps serving
// the last good pair, so a half-written secret update cannot take the
// listener down.
type Reloader struct {
	certPath, keyPath string

	mu      sync.Mutex
	cert    *tls.Certificate
	stamp   [2]fileStamp
	lastErr error
}

type fileStamp struct {
	mod  time.Time
	size int64
}

// NewReloader loads dir/tls.crt and dir/tls.key; it fails if they do not
// form a valid pair now.
func NewReloader(dir string) (*Reloader, error) {
	r := &Reloader{certPath: filepath.Join(dir, CertFile), keyPath: filepath.Join(dir, KeyFile)}
	if err := r.reload(); err != nil {
		return nil, err
	}
	return r, nil
}

func stamp(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, fmt.Errorf("stat %s: %w", path, err)
	}
	return fileStamp{mod: fi.ModTime(), size: fi.Size()}, nil
}

// reload loads the pair if the files changed since the last load. It must
// be called with mu held (or before r is shared).
func (r *Reloader) reload() error {
	cs, err := stamp(r.certPath)
	if err != nil {
		return err
	}
	ks, err := stamp(r.keyPath)
	if err != nil {
		return err
	}
	if r.cert != nil && cs == r.stamp[0] && ks == r.stamp[1] {
		return nil
	}
	cert, err := tls.LoadX509KeyPair(r.certPath, r.keyPath)
	if err != nil {
		return fmt.Errorf("load key pair %s, %s: %w", r.certPath, r.keyPath, err)
	}
	r.cert, r.stamp = &cert, [2]fileStamp{cs, ks}
	return nil
}

// GetCertificate returns the current pair, reloading it first if the files
// changed. Handshakes are rare (gateways hold long-lived HTTP/2
// connections), so two stat calls per handshake cost nothing noticeable.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lastErr = r.reload()
	return r.cert, nil
}

// LastError returns the error of the most recent reload attempt, nil when
// the served pair is current.
func (r *Reloader) LastError() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastErr
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
