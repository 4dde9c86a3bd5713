package tlsutil

import (
	"testing"
)

// FuzzLoadPEM: whatever a mounted Secret holds (tls.crt, tls.key, a CA
// bundle: anyone who may write the Secret chooses the bytes), reading it
// never panics, and a read that succeeds gives a certificate, or a pool,
// that is there. (The reloaders read the files and call these.)
func FuzzLoadPEM(f *testing.F) {
	cert, err := SelfSigned("localhost")
	if err != nil {
		f.Fatal(err)
	}
	certPEM, keyPEM, err := EncodePEM(cert)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(certPEM, keyPEM, certPEM)
	f.Add(keyPEM, certPEM, append(append([]byte{}, certPEM...), keyPEM...))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), []byte("-----BEGIN EC PRIVATE KEY-----\n\n-----END EC PRIVATE KEY-----\n"), []byte("-----BEGIN CERTIFICATE-----\n"))
	f.Add([]byte{}, []byte{}, []byte{})
	f.Fuzz(func(t *testing.T, crt, key, ca []byte) {
		if c, err := parsePair(crt, key); err == nil && (c == nil || len(c.Certificate) == 0 || c.PrivateKey == nil) {
			t.Fatalf("a pair read without error: %v", c)
		}
		if p, err := parseCABundle(ca); err == nil && p == nil {
			t.Fatal("a bundle read without error gives no pool")
		}
	})
}
