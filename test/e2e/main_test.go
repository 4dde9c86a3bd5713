package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/internal/testbed/testenv"
)

// Environment names (E2E_ENV).
const (
	envLocal = "local"
	envKind  = "kind"
)

// e2eEnv is the environment the scenarios run in.
func e2eEnv() string {
	if v := strings.TrimSpace(os.Getenv("E2E_ENV")); v != "" {
		return v
	}
	return envLocal
}

// shared holds what the tests of this binary share, each started on first
// use and stopped by TestMain.
var shared struct {
	root string

	helmOnce sync.Once
	helm     string
	helmErr  error

	apiOnce sync.Once
	apiCfg  *rest.Config
	apiStop func() error
	apiErr  error

	binOnce sync.Once
	binDir  string
	bins    launch.Binaries
	binErr  error
}

func TestMain(m *testing.M) {
	root, err := testenv.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	shared.root = root
	code := m.Run()
	if shared.apiStop != nil {
		if err := shared.apiStop(); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: stop kube-apiserver:", err)
		}
	}
	if kindShared.cleanup != nil {
		kindShared.cleanup()
	}
	if shared.binDir != "" {
		_ = os.RemoveAll(shared.binDir)
	}
	os.Exit(code)
}

// helmBinary returns helm: $HELM, else bin/helm, built from the tools
// module (hack/tools, as `make helm` does) when it is missing so that `go
// test` alone works on a fresh clone.
func helmBinary(t testing.TB) string {
	t.Helper()
	shared.helmOnce.Do(func() {
		if p := os.Getenv("HELM"); p != "" {
			shared.helm, shared.helmErr = p, nil
			if _, err := os.Stat(p); err != nil {
				shared.helmErr = fmt.Errorf("$HELM=%s: %w", p, err)
			}
			return
		}
		p := filepath.Join(shared.root, "bin", "helm")
		if _, err := os.Stat(p); err == nil {
			shared.helm = p
			return
		}
		gotool, err := launch.GoTool()
		if err != nil {
			shared.helmErr = fmt.Errorf("build helm (as `make helm`): %w", err)
			return
		}
		cmd := exec.Command(gotool, "build", "-o", p, "helm.sh/helm/v3/cmd/helm")
		cmd.Dir = filepath.Join(shared.root, "hack", "tools")
		if out, err := cmd.CombinedOutput(); err != nil {
			shared.helmErr = fmt.Errorf("build helm (as `make helm`): %w\n%s", err, out)
			return
		}
		shared.helm = p
	})
	if shared.helmErr != nil {
		t.Fatal(shared.helmErr)
	}
	return shared.helm
}

// apiServer returns a real kube-apiserver (envtest) shared by the whole
// binary. It starts with no CRD at all: the chart's own CRDs are what the
// tests install, so a CRD missing from the chart fails them. Without the
// envtest binaries the test skips and says to run `make envtest`.
func apiServer(t testing.TB) *rest.Config {
	t.Helper()
	shared.apiOnce.Do(func() {
		assets, err := testenv.AssetsDir()
		if err != nil {
			shared.apiErr = err
			return
		}
		env := &envtest.Environment{BinaryAssetsDirectory: assets}
		cfg, err := env.Start()
		if err != nil {
			_ = env.Stop()
			shared.apiErr = fmt.Errorf("start kube-apiserver (assets %s): %w", assets, err)
			return
		}
		shared.apiCfg, shared.apiStop = cfg, env.Stop
	})
	if errors.Is(shared.apiErr, testenv.ErrNoAssets) {
		t.Skip(shared.apiErr.Error())
	}
	if shared.apiErr != nil {
		t.Fatal(shared.apiErr)
	}
	return rest.CopyConfig(shared.apiCfg)
}

// binaries builds cmd/epp, cmd/modelsim and cmd/gateway once into a
// temporary folder; the picker with the race detector when launch.RaceEnv
// asks (as in test/integration): slower, and it makes a data race in the
// real binary under these workloads fail the suite.
func binaries(t testing.TB) launch.Binaries {
	t.Helper()
	shared.binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "laneway-e2e-bin-")
		if err != nil {
			shared.binErr = err
			return
		}
		shared.binDir = dir
		shared.bins, shared.binErr = launch.Build(dir, launch.RaceFromEnv(), launch.CmdEpp, launch.CmdModelsim, launch.CmdGateway)
	})
	if shared.binErr != nil {
		t.Fatal(shared.binErr)
	}
	return shared.bins
}

// testContext is a context bounded by the test's deadline (less a margin
// for cleanup) and by max.
func testContext(t testing.TB, max time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), max)
	if tt, ok := t.(*testing.T); ok {
		if dl, ok := tt.Deadline(); ok {
			var c2 context.CancelFunc
			ctx, c2 = context.WithDeadline(ctx, dl.Add(-30*time.Second))
			prev := cancel
			cancel = func() { c2(); prev() }
		}
	}
	t.Cleanup(cancel)
	return ctx
}
