package testenv

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/laneway-dev/laneway/api/v1alpha1"
)

func TestRepoRoot(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !bytesHasPrefix(data, "module github.com/laneway-dev/laneway\n") {
		t.Fatalf("RepoRoot() = %s, whose go.mod is not laneway's (%v)", root, err)
	}
}

func bytesHasPrefix(b []byte, p string) bool { return len(b) >= len(p) && string(b[:len(p)]) == p }

func TestAssetsDirMissing(t *testing.T) {
	empty := t.TempDir()
	t.Setenv("KUBEBUILDER_ASSETS", empty)
	_, err := AssetsDir()
	if !errors.Is(err, ErrNoAssets) {
		t.Fatalf("AssetsDir() with an empty KUBEBUILDER_ASSETS = %v, want ErrNoAssets", err)
	}
	if _, _, err := Start(); !errors.Is(err, ErrNoAssets) {
		t.Fatalf("Start() = %v, want ErrNoAssets", err)
	}
}

// TestStart starts the API server and creates one object of each installed
// CRD: Laneway's and the upstream InferencePool. Stopping the API server
// alone makes calls fail; started again, it has the objects, and both the
// admin config and a ServiceAccount token issued before still work.
func TestStart(t *testing.T) {
	if _, err := AssetsDir(); errors.Is(err, ErrNoAssets) {
		t.Skip(err.Error())
	}
	e, err := StartEnv()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	cfg := e.Config
	scheme, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pool := &inferencev1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: "llm", Namespace: "default"},
		Spec: inferencev1.InferencePoolSpec{
			Selector:          inferencev1.LabelSelector{MatchLabels: map[inferencev1.LabelKey]inferencev1.LabelValue{"app": "vllm"}},
			TargetPorts:       []inferencev1.Port{{Number: 8000}},
			EndpointPickerRef: &inferencev1.EndpointPickerRef{Name: "laneway", Port: &inferencev1.Port{Number: 9002}},
		},
	}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatalf("create InferencePool: %v", err)
	}
	class := &v1alpha1.PolicyClass{
		ObjectMeta: metav1.ObjectMeta{Name: "standard", Namespace: "default"},
		Spec:       v1alpha1.PolicyClassSpec{PoolRef: v1alpha1.PoolReference{Name: "llm"}, Quantum: 1},
	}
	if err := c.Create(ctx, class); err != nil {
		t.Fatalf("create PolicyClass: %v", err)
	}
	var got inferencev1.InferencePool
	if err := c.Get(ctx, client.ObjectKeyFromObject(pool), &got); err != nil || got.Spec.TargetPorts[0].Number != 8000 {
		t.Fatalf("read back InferencePool: %v %+v", err, got.Spec)
	}

	// A ServiceAccount kubeconfig authenticates (Forbidden, not
	// Unauthorized) with the ServiceAccount's rights only: none here.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "laneway-epp", Namespace: "default"}}
	if err := c.Create(ctx, sa); err != nil {
		t.Fatalf("create ServiceAccount: %v", err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	saCfg, err := ServiceAccountKubeconfig(ctx, cfg, "default", sa.Name, path)
	if err != nil {
		t.Fatal(err)
	}
	fromFile, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatalf("load the written kubeconfig: %v", err)
	}
	for name, rc := range map[string]*rest.Config{"returned config": saCfg, "kubeconfig file": fromFile} {
		cs, err := kubernetes.NewForConfig(rc)
		if err != nil {
			t.Fatal(err)
		}
		_, err = cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s: listing pods as the ServiceAccount = %v, want Forbidden", name, err)
		}
	}

	if err := e.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(pool), &got); err == nil {
		t.Fatal("read the InferencePool with the API server stopped")
	}
	if err := e.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(pool), &got); err != nil {
		t.Fatalf("read back the InferencePool after the restart: %v", err)
	}
	cs, err := kubernetes.NewForConfig(saCfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the ServiceAccount token after the restart: %v, want Forbidden (authenticated)", err)
	}
}
