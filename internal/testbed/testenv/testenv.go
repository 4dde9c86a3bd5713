package testenv

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/laneway-dev/laneway/api/v1alpha1"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

// ErrNoAssets is wrapped by Start and AssetsDir when the kube-apiserver and
// etcd binaries are not there; a test skips on it (errors.Is) instead of
// failing, and says to run `make envtest`.
var ErrNoAssets = errors.New("envtest binaries (kube-apiserver, etcd) not found; run `make envtest`")

// RepoRoot returns the directory of the module's go.mod, found by walking up
// from the working directory (a test's working directory is its package).
func RepoRoot() (string, error) { return launch.ModuleRoot() }

// AssetsDir returns the directory holding kube-apiserver and etcd:
// $KUBEBUILDER_ASSETS when set, else <repo root>/bin/k8s. The error wraps
// ErrNoAssets when a binary is missing.
func AssetsDir() (string, error) {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		root, err := RepoRoot()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(root, "bin", "k8s")
	}
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			return "", fmt.Errorf("%w (looked in %s)", ErrNoAssets, dir)
		}
	}
	return dir, nil
}

// CRDDirs returns the CRD directories Start installs: Laneway's generated
// CRDs and the vendored upstream ones.
func CRDDirs() ([]string, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	return []string{
		filepath.Join(root, "config", "crd", "bases"),
		filepath.Join(root, "config", "crd", "external"),
	}, nil
}

// Scheme returns a scheme with the built-in kinds, Laneway's kinds and the
// upstream InferencePool kinds registered.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, v1alpha1.AddToScheme, inferencev1.Install,
	} {
		if err := add(s); err != nil {
			return nil, fmt.Errorf("build test scheme: %w", err)
		}
	}
	return s, nil
}

// startTimeout is how long each of etcd and kube-apiserver may take to
// become ready. envtest's 20 s default is too short on a 2-core machine
// shared by parallel builds, where a start has been seen to take longer;
// KUBEBUILDER_CONTROLPLANE_START_TIMEOUT still overrides it.
const startTimeout = 3 * time.Minute

// stopTimeout is how long each process may take to exit after SIGTERM
// before it is killed. kube-apiserver with clients' watches open has been
// seen to take over a minute to finish its graceful termination; neither
// a suite's end nor an outage test needs it graceful.
const stopTimeout = 10 * time.Second

// Env is a running etcd and kube-apiserver, with the CRDs of CRDDirs
// installed.
type Env struct {
	// Config reaches the API server as cluster admin.
	Config *rest.Config

	env     *envtest.Environment
	certDir string // the API server's certificates and keys, kept across restarts
}

// Start starts etcd and kube-apiserver with the CRDs of CRDDirs installed
// and established, and returns a rest.Config for it and a function that
// stops both processes. It takes a few seconds; start it once per test
// binary (TestMain) and share it.
func Start() (*rest.Config, func() error, error) {
	e, err := StartEnv()
	if err != nil {
		return nil, nil, err
	}
	return e.Config, e.Stop, nil
}

// StartEnv is Start returning the Env, which can also stop and restart the
// API server alone (StopAPIServer, StartAPIServer).
func StartEnv() (*Env, error) {
	assets, err := AssetsDir()
	if err != nil {
		return nil, err
	}
	dirs, err := CRDDirs()
	if err != nil {
		return nil, err
	}
	// A certificate directory of our own: envtest removes one it made
	// itself when the API server stops, and a restarted server would then
	// serve new certificates and sign with a new ServiceAccount key, so
	// that no client of the old one could talk to it.
	certDir, err := os.MkdirTemp("", "laneway-apiserver-")
	if err != nil {
		return nil, fmt.Errorf("envtest certificate dir: %w", err)
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory:    assets,
		ControlPlaneStartTimeout: startTimeout,
		ControlPlaneStopTimeout:  stopTimeout,
		CRDDirectoryPaths:        dirs,
		ErrorIfCRDPathMissing:    true,
		// Waiting for the CRDs to be served has the same problem as the
		// start (envtest's default is 10 s).
		CRDInstallOptions: envtest.CRDInstallOptions{MaxTime: startTimeout},
	}
	env.ControlPlane.APIServer = &envtest.APIServer{CertDir: certDir}
	if v := os.Getenv("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT"); v != "" {
		env.ControlPlaneStartTimeout = 0 // envtest reads the variable itself
	}
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop()
		_ = os.RemoveAll(certDir)
		return nil, fmt.Errorf("start envtest (assets %s): %w", assets, err)
	}
	return &Env{Config: cfg, env: env, certDir: certDir}, nil
}

// Stop stops the API server and etcd.
func (e *Env) Stop() error {
	err := e.env.Stop()
	if rerr := os.RemoveAll(e.certDir); err == nil && rerr != nil {
		err = fmt.Errorf("remove %s: %w", e.certDir, rerr)
	}
	return err
}

// StopAPIServer stops the kube-apiserver process (SIGTERM, SIGKILL after
// stopTimeout) and returns once it has exited; etcd, and with it every
// object, stays. Clients then get connection refused, as during a
// control-plane outage.
func (e *Env) StopAPIServer() error {
	err := e.env.ControlPlane.APIServer.Stop()
	if err == nil {
		return nil
	}
	// envtest reports the kill as a failure to stop; the port tells
	// whether the server is gone.
	addr := e.env.ControlPlane.APIServer.SecureServing.ListenAddr.HostPort()
	c, derr := net.DialTimeout("tcp", addr, time.Second)
	if derr != nil {
		return nil
	}
	c.Close()
	return fmt.Errorf("stop kube-apiserver (%s still accepts connections): %w", addr, err)
}

// StartAPIServer starts the kube-apiserver again after StopAPIServer, on
// the same address with the same certificates, client CA and
// ServiceAccount signing key, and returns once it is healthy: Config and
// every ServiceAccount token issued before work again.
func (e *Env) StartAPIServer() error {
	if err := e.env.ControlPlane.APIServer.Start(); err != nil {
		return fmt.Errorf("restart kube-apiserver: %w", err)
	}
	return nil
}
