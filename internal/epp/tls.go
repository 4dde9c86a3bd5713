package epp

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// SelfSignedCert makes an in-memory ECDSA P-256 certificate valid for ten
// years. Gateways reach the picker through a Service and do not verify it
// (the upstream picker does the same); mount a real one with --cert-path.
func SelfSignedCert() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate TLS key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"Laneway"}, CommonName: "laneway-epp"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              []string{"localhost", "laneway-epp"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("create certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// keypairReloader serves the certificate in a folder and rereads it when
// the files change (cert-manager rotates Secrets in place), checking at
// most once every few seconds.
type keypairReloader struct {
	crt, key string
	mu       sync.Mutex
	cert     *tls.Certificate
	modTime  time.Time
	checked  time.Time
}

func newKeypairReloader(dir string) (*keypairReloader, error) {
	k := &keypairReloader{crt: filepath.Join(dir, "tls.crt"), key: filepath.Join(dir, "tls.key")}
	if err := k.load(); err != nil {
		return nil, err
	}
	return k, nil
}

func (k *keypairReloader) load() error {
	st, err := os.Stat(k.crt)
	if err != nil {
		return fmt.Errorf("--cert-path: %w", err)
	}
	c, err := tls.LoadX509KeyPair(k.crt, k.key)
	if err != nil {
		return fmt.Errorf("--cert-path: load key pair: %w", err)
	}
	k.cert, k.modTime = &c, st.ModTime()
	return nil
}

func (k *keypairReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if time.Since(k.checked) > 5*time.Second {
		k.checked = time.Now()
		if st, err := os.Stat(k.crt); err == nil && !st.ModTime().Equal(k.modTime) {
			// A half-written pair fails to load; keep serving the old one.
			_ = k.load()
		}
	}
	return k.cert, nil
}
