package testenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/laneway-dev/laneway/api/v1alpha1"
	"github.com/laneway-dev/laneway/internal/launch"
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

// Start starts etcd and kube-apiserver with the CRDs of CRDDirs installed
// and established, and returns a rest.Config for it and a function that
// stops both processes. It takes a few seconds; start it once per test
// binary (TestMain) and share it.
func Start() (*rest.Config, func() error, error) {
	assets, err := AssetsDir()
	if err != nil {
		return nil, nil, err
	}
	dirs, err := CRDDirs()
	if err != nil {
		return nil, nil, err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory:    assets,
		ControlPlaneStartTimeout: startTimeout,
		ControlPlaneStopTimeout:  time.Minute,
		CRDDirectoryPaths:        dirs,
		ErrorIfCRDPathMissing:    true,
		// Waiting for the CRDs to be served has the same problem as the
		// start (envtest's default is 10 s).
		CRDInstallOptions: envtest.CRDInstallOptions{MaxTime: startTimeout},
	}
	if v := os.Getenv("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT"); v != "" {
		env.ControlPlaneStartTimeout = 0 // envtest reads the variable itself
	}
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop()
		return nil, nil, fmt.Errorf("start envtest (assets %s): %w", assets, err)
	}
	return cfg, env.Stop, nil
}
