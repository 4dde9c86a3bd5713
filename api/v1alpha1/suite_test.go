package v1alpha1_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/laneway-dev/laneway/internal/testbed/testenv"
)

// One API server for the package's tests (a start costs seconds).
var (
	restCfg    *rest.Config
	k8s        client.Client
	skipReason string
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	cfg, stop, err := testenv.Start()
	switch {
	case errors.Is(err, testenv.ErrNoAssets):
		skipReason = err.Error()
		return m.Run()
	case err != nil:
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop envtest:", err)
		}
	}()
	scheme, err := testenv.Scheme()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	restCfg = cfg
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		return 1
	}
	return m.Run()
}

// needAPIServer skips a test when the envtest binaries are not built.
func needAPIServer(t *testing.T) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
}

// namespace creates a fresh namespace for one test.
func namespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "admission-"}}
	if err := k8s.Create(context.Background(), ns); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	return ns.Name
}

// mustRefuse creates obj and requires the API server to refuse it with a
// message holding every one of want; spec is what the failure prints.
func mustRefuse(t *testing.T, obj client.Object, spec any, want []string) {
	t.Helper()
	err := k8s.Create(context.Background(), obj)
	if err == nil {
		t.Fatalf("API server accepted %+v", spec)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("refusal %q lacks %q", err.Error(), w)
		}
	}
}
