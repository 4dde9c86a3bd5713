package v1alpha1_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/laneway-dev/laneway/internal/testbed/testenv"
)

// TestGeneratedFilesUpToDate regenerates the deepcopy code and the CRDs with
// the controller-gen that hack/tools pins, into a temporary directory, and
// fails when the committed files differ: run `make generate manifests`.
// It builds controller-gen (from the build cache after the first time) and
// skips only when that build is impossible, e.g. offline with an empty
// module cache.
func TestGeneratedFilesUpToDate(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the controller-gen build")
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	gen := filepath.Join(tmp, "controller-gen")
	build := exec.Command("go", "build", "-o", gen, "sigs.k8s.io/controller-tools/cmd/controller-gen")
	build.Dir = filepath.Join(root, "hack", "tools")
	if out, err := build.CombinedOutput(); err != nil {
		t.Skipf("cannot build controller-gen from hack/tools, so the generated files are not checked: %v\n%s", err, out)
	}
	objDir, crdDir := filepath.Join(tmp, "obj"), filepath.Join(tmp, "crd")
	run := exec.Command(gen, "object", "crd", "paths=./api/...", "output:object:dir="+objDir, "output:crd:dir="+crdDir)
	run.Dir = root
	if out, err := run.CombinedOutput(); err != nil {
		t.Fatalf("controller-gen: %v\n%s", err, out)
	}

	compare := func(fresh, committed string) {
		t.Helper()
		want, err := os.ReadFile(fresh)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(committed)
		if err != nil {
			t.Errorf("%s: %v; run `make generate manifests` and commit the result", committed, err)
			return
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale; run `make generate manifests` and commit the result", committed)
		}
	}
	compare(filepath.Join(objDir, "zz_generated.deepcopy.go"), filepath.Join(root, "api", "v1alpha1", "zz_generated.deepcopy.go"))

	fresh, err := filepath.Glob(filepath.Join(crdDir, "*.yaml"))
	if err != nil || len(fresh) == 0 {
		t.Fatalf("controller-gen wrote no CRDs (%v)", err)
	}
	committed, err := filepath.Glob(filepath.Join(root, "config", "crd", "bases", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var freshNames, committedNames []string
	for _, f := range fresh {
		freshNames = append(freshNames, filepath.Base(f))
		compare(f, filepath.Join(root, "config", "crd", "bases", filepath.Base(f)))
	}
	for _, f := range committed {
		committedNames = append(committedNames, filepath.Base(f))
	}
	if !slices.Equal(freshNames, committedNames) {
		t.Errorf("config/crd/bases holds %v, controller-gen makes %v", committedNames, freshNames)
	}
}
