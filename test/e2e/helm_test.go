package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// chartDir is the chart under test.
func chartDir() string { return filepath.Join(shared.root, "charts", "laneway") }

// renderArgs are one `helm template` call.
type renderArgs struct {
	release, namespace string
	// valuesFiles are -f files; set are --set key=value pairs.
	valuesFiles []string
	set         []string
	// values is YAML written to a temporary -f file after valuesFiles.
	values string
}

// helmTemplate runs `helm template --include-crds` and returns its output
// and error (the error carries helm's stderr, which is what schema and
// template failures are judged by).
func helmTemplate(t testing.TB, a renderArgs) (string, error) {
	t.Helper()
	args := []string{"template", a.release, chartDir(), "--namespace", a.namespace, "--include-crds"}
	for _, f := range a.valuesFiles {
		args = append(args, "-f", f)
	}
	if a.values != "" {
		f := filepath.Join(t.TempDir(), "values.yaml")
		if err := writeFile(f, a.values); err != nil {
			t.Fatal(err)
		}
		args = append(args, "-f", f)
	}
	for _, s := range a.set {
		args = append(args, "--set", s)
	}
	cmd := exec.Command(helmBinary(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// render is helmTemplate that must succeed, decoded into objects.
func render(t testing.TB, a renderArgs) []*unstructured.Unstructured {
	t.Helper()
	out, err := helmTemplate(t, a)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeObjects(out)
	if err != nil {
		t.Fatalf("decode helm output: %v\n%s", err, out)
	}
	return objs
}

// decodeObjects splits a multi-document YAML stream into objects, skipping
// empty documents (templates that rendered nothing).
func decodeObjects(s string) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(s), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetKind() == "" || u.GetAPIVersion() == "" {
			return nil, fmt.Errorf("document without kind or apiVersion: %v", m)
		}
		objs = append(objs, u)
	}
}

// findObject returns the rendered object of that kind and name, or nil.
func findObject(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && (name == "" || o.GetName() == name) {
			return o
		}
	}
	return nil
}

// mustFind is findObject that fails the test when the object is missing.
func mustFind(t testing.TB, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	o := findObject(objs, kind, name)
	if o == nil {
		var have []string
		for _, o := range objs {
			have = append(have, o.GetKind()+"/"+o.GetName())
		}
		t.Fatalf("no %s %q rendered; have %s", kind, name, strings.Join(have, ", "))
	}
	return o
}

// kinds lists the rendered objects as Kind/name, sorted as rendered.
func kinds(objs []*unstructured.Unstructured) []string {
	out := make([]string, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.GetKind()+"/"+o.GetName())
	}
	return out
}

// fieldManager owns every field the suites apply.
const fieldManager = "laneway-e2e"

// applier applies rendered objects to an API server with server-side apply
// (a real create or update, so every admission rule, OpenAPI schema, CEL
// rule and unknown-field check of the server runs).
type applier struct {
	c client.Client
}

func newApplier(cfg *rest.Config) (*applier, error) {
	scheme := runtime.NewScheme()
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", cfg.Host, err)
	}
	return &applier{c: c}, nil
}

// isCRD reports whether o is a CustomResourceDefinition.
func isCRD(o *unstructured.Unstructured) bool {
	return o.GetKind() == "CustomResourceDefinition" && strings.HasPrefix(o.GetAPIVersion(), "apiextensions.k8s.io/")
}

// apply applies objs in order: CRDs first (waiting until each is
// established, so the kinds they define can be applied next), then the
// rest. An error names the object the server refused and why.
func (a *applier) apply(ctx context.Context, objs []*unstructured.Unstructured) error {
	var crds, rest []*unstructured.Unstructured
	for _, o := range objs {
		if isCRD(o) {
			crds = append(crds, o)
		} else {
			rest = append(rest, o)
		}
	}
	for _, o := range crds {
		if err := a.applyOne(ctx, o); err != nil {
			return err
		}
	}
	for _, o := range crds {
		if err := a.waitEstablished(ctx, o.GetName()); err != nil {
			return err
		}
	}
	for _, o := range rest {
		if err := a.applyOne(ctx, o); err != nil {
			return err
		}
	}
	return nil
}

func (a *applier) applyOne(ctx context.Context, o *unstructured.Unstructured) error {
	o = o.DeepCopy()
	// A kind defined by a CRD applied a moment ago may not be in the
	// client's discovery cache yet: retry "no match" for a short while.
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := a.c.Apply(ctx, client.ApplyConfigurationFromUnstructured(o), client.FieldOwner(fieldManager), client.ForceOwnership)
		if meta.IsNoMatchError(err) {
			return false, nil
		}
		return true, err
	})
	if err != nil {
		return fmt.Errorf("apply %s %s/%s: %w", o.GetKind(), o.GetNamespace(), o.GetName(), err)
	}
	return nil
}

// waitEstablished polls a CRD until its Established condition is True;
// the API server offers no watch-free event for it.
func (a *applier) waitEstablished(ctx context.Context, name string) error {
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var crd apiextensionsv1.CustomResourceDefinition
		if err := a.c.Get(ctx, client.ObjectKey{Name: name}, &crd); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		for _, c := range crd.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("CRD %s not established: %w", name, err)
	}
	return nil
}

// exists reports whether the server holds the object.
func (a *applier) exists(ctx context.Context, o *unstructured.Unstructured) error {
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(o.GroupVersionKind())
	return a.c.Get(ctx, client.ObjectKeyFromObject(o), got)
}

// ensureNamespace creates ns unless it exists.
func (a *applier) ensureNamespace(ctx context.Context, ns string) error {
	o := &unstructured.Unstructured{}
	o.SetAPIVersion("v1")
	o.SetKind("Namespace")
	o.SetName(ns)
	if err := a.c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", ns, err)
	}
	return nil
}

func ptrTo[T any](v T) *T { return &v }

// applyInferencePoolCRD installs the vendored upstream InferencePool CRD,
// as a cluster's gateway would have brought it.
func (a *applier) applyInferencePoolCRD(ctx context.Context) error {
	raw, err := os.ReadFile(filepath.Join(shared.root, "config", "crd", "external", "inference.networking.k8s.io_inferencepools.yaml"))
	if err != nil {
		return err
	}
	crd, err := decodeObjects(string(raw))
	if err != nil {
		return err
	}
	return a.apply(ctx, crd)
}
