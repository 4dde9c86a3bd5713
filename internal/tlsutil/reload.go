package tlsutil

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// CAFile is the file name of a CA bundle inside a Kubernetes Secret or
// ConfigMap, as cert-manager and the service CA injector write it.
const CAFile = "ca.crt"

// watched is a value loaded from files and loaded again, at the next use,
// once any of them changed. Changed means another file (a new inode: a
// Kubernetes Secret or ConfigMap volume swaps a symlink to a new directory;
// an editor renames a new file over the old), another modification time or
// another size. A failed load keeps the last good value, so a half-written
// update cannot take the listener down; it is tried again at every use
// until it succeeds.
type watched[T any] struct {
	paths []string
	load  func() (T, error)
	// onReload, when set, hears each load after the first: nil for a new
	// value in service, else why the old one stays. Called with mu held.
	onReload func(error)

	mu      sync.Mutex
	val     T
	loaded  bool
	seen    []os.FileInfo
	lastErr error
}

// get returns the current value, loading it first if a file changed.
func (w *watched[T]) get() T {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lastErr = w.refresh()
	return w.val
}

// refresh loads the value if the files changed since the last good load.
// It must be called with mu held (or before w is shared).
func (w *watched[T]) refresh() error {
	seen := make([]os.FileInfo, len(w.paths))
	for i, p := range w.paths {
		fi, err := os.Stat(p) // follows the symlinks of a Secret volume
		if err != nil {
			return w.failed(fmt.Errorf("stat %s: %w", p, err))
		}
		seen[i] = fi
	}
	if w.loaded && sameFiles(seen, w.seen) {
		return nil
	}
	v, err := w.load()
	if err != nil {
		return w.failed(err)
	}
	first := !w.loaded
	w.val, w.loaded, w.seen = v, true, seen
	if !first && w.onReload != nil {
		w.onReload(nil)
	}
	return nil
}

// failed reports a failed reload once per distinct error, so a broken
// file does not log at every handshake.
func (w *watched[T]) failed(err error) error {
	if w.loaded && w.onReload != nil && (w.lastErr == nil || w.lastErr.Error() != err.Error()) {
		w.onReload(err)
	}
	return err
}

func sameFiles(a, b []os.FileInfo) bool {
	for i := range a {
		if !os.SameFile(a[i], b[i]) || !a[i].ModTime().Equal(b[i].ModTime()) || a[i].Size() != b[i].Size() {
			return false
		}
	}
	return true
}

// lastError returns the error of the most recent reload attempt.
func (w *watched[T]) lastError() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastErr
}

// Reloader serves the key pair in a directory (tls.crt, tls.key) and
// reloads it at the next handshake after either file changed (see
// watched: a Kubernetes Secret update is seen without inotify).
// Connections already established keep the certificate they were served.
type Reloader struct {
	w watched[*tls.Certificate]
}

// NewReloader loads dir/tls.crt and dir/tls.key; it fails if they do not
// form a valid pair now. onReload, when not nil, hears every later reload:
// nil when a new pair is in service, else why the last good one stays.
func NewReloader(dir string, onReload func(error)) (*Reloader, error) {
	certPath, keyPath := filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile)
	r := &Reloader{w: watched[*tls.Certificate]{
		paths: []string{certPath, keyPath},
		load: func() (*tls.Certificate, error) {
			certPEM, err := os.ReadFile(certPath)
			if err != nil {
				return nil, fmt.Errorf("load key pair: %w", err)
			}
			keyPEM, err := os.ReadFile(keyPath)
			if err != nil {
				return nil, fmt.Errorf("load key pair: %w", err)
			}
			cert, err := parsePair(certPEM, keyPEM)
			if err != nil {
				return nil, fmt.Errorf("load key pair %s, %s: %w", certPath, keyPath, err)
			}
			return cert, nil
		},
		onReload: onReload,
	}}
	if err := r.w.refresh(); err != nil {
		return nil, err
	}
	return r, nil
}

// GetCertificate returns the current pair, reloading it first if the files
// changed. Handshakes are rare (gateways hold long-lived HTTP/2
// connections), so two stat calls per handshake cost nothing noticeable.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.w.get(), nil
}

// LastError returns the error of the most recent reload attempt, nil when
// the served pair is current.
func (r *Reloader) LastError() error { return r.w.lastError() }

// CAReloader is a CA bundle file (PEM, one or more certificates) that is
// reloaded at the next handshake after it changed, as Reloader does for a
// key pair.
type CAReloader struct {
	w watched[*x509.CertPool]
}

// NewCAReloader loads the bundle at path; it fails unless the file holds
// at least one PEM certificate now. onReload is as in NewReloader.
func NewCAReloader(path string, onReload func(error)) (*CAReloader, error) {
	r := &CAReloader{w: watched[*x509.CertPool]{
		paths:    []string{path},
		load:     func() (*x509.CertPool, error) { return loadCABundle(path) },
		onReload: onReload,
	}}
	if err := r.w.refresh(); err != nil {
		return nil, err
	}
	return r, nil
}

// Pool returns the current bundle, reloading it first if the file changed.
func (r *CAReloader) Pool() *x509.CertPool { return r.w.get() }

// LastError returns the error of the most recent reload attempt.
func (r *CAReloader) LastError() error { return r.w.lastError() }

// errNoCertificates is the error of a bundle without a certificate.
var errNoCertificates = errors.New("no PEM certificate in it")

func loadCABundle(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read CA bundle: %w", err)
	}
	pool, err := parseCABundle(data)
	if err != nil {
		return nil, fmt.Errorf("CA bundle %s: %w", path, err)
	}
	return pool, nil
}

// parseCABundle reads a PEM bundle: at least one certificate.
func parseCABundle(data []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, errNoCertificates
	}
	return pool, nil
}

// parsePair reads a PEM certificate chain and its private key, as a
// mounted Secret's tls.crt and tls.key hold them.
func parsePair(certPEM, keyPEM []byte) (*tls.Certificate, error) {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	return &cert, nil
}
