package controller

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/laneway-dev/laneway/internal/testbed/testenv"
)

// rbacMarker matches one +kubebuilder:rbac marker line.
var rbacMarker = regexp.MustCompile(`^//\s*\+kubebuilder:rbac:(.*)$`)

// markerRules reads the package's rbac markers as (group, resource,
// resource names) -> verbs, and the namespace of each marker.
func markerRules(t *testing.T) (map[string][]string, []string) {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	rules := map[string][]string{}
	var namespaces []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			m := rbacMarker.FindStringSubmatch(strings.TrimSpace(line))
			if m == nil {
				continue
			}
			args := map[string]string{}
			for _, kv := range strings.Split(m[1], ",") {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					t.Fatalf("%s: marker argument %q is not key=value", f, kv)
				}
				args[k] = strings.Trim(v, `"`)
			}
			namespaces = append(namespaces, args["namespace"])
			for _, g := range strings.Split(args["groups"], ";") {
				for _, r := range strings.Split(args["resources"], ";") {
					key := ruleKey(g, r, strings.Split(args["resourceNames"], ";"))
					rules[key] = append(rules[key], strings.Split(args["verbs"], ";")...)
				}
			}
		}
	}
	for k := range rules {
		slices.Sort(rules[k])
		rules[k] = slices.Compact(rules[k])
	}
	return rules, namespaces
}

// ruleKey names a rule's object set: group/resource, and [names] when the
// rule is restricted to some.
func ruleKey(group, resource string, names []string) string {
	names = slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == "" })
	if len(names) == 0 {
		return group + "/" + resource
	}
	slices.Sort(names)
	return group + "/" + resource + "[" + strings.Join(names, ";") + "]"
}

func readYAML(t *testing.T, path string, into any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	// controller-gen starts its output with a document separator.
	data = bytes.TrimPrefix(bytes.TrimSpace(data), []byte("---\n"))
	if err := yaml.UnmarshalStrict(data, into); err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
}

// TestRBACMatchesMarkers fails when config/rbac/role.yaml is stale: it must
// grant exactly what the markers say, namespaced.
func TestRBACMatchesMarkers(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	want, namespaces := markerRules(t)
	if len(want) == 0 {
		t.Fatal("no +kubebuilder:rbac markers found")
	}
	for i, ns := range namespaces {
		if ns == "" {
			t.Errorf("marker %d has no namespace=: controller-gen would make it cluster-wide", i)
		}
	}
	var role rbacv1.Role
	readYAML(t, filepath.Join(root, "config", "rbac", "role.yaml"), &role)
	if role.Kind != "Role" || role.Name != "laneway-epp" {
		t.Fatalf("role.yaml is %s %q, want Role laneway-epp", role.Kind, role.Name)
	}
	got := map[string][]string{}
	for _, r := range role.Rules {
		if len(r.NonResourceURLs) > 0 {
			t.Errorf("rule %+v uses nonResourceURLs, which the markers do not", r)
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				key := ruleKey(g, res, r.ResourceNames)
				got[key] = append(got[key], r.Verbs...)
			}
		}
	}
	for k := range got {
		slices.Sort(got[k])
		got[k] = slices.Compact(got[k])
	}
	for k, v := range want {
		if !slices.Equal(got[k], v) {
			t.Errorf("role.yaml grants %s verbs %v, markers say %v: run `make manifests`", k, got[k], v)
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("role.yaml grants %s %v, which no marker asks for: run `make manifests`", k, v)
		}
		if slices.Contains(v, "*") {
			t.Errorf("role.yaml grants every verb on %s", k)
		}
	}
}

// TestLeaseRuleNamesThePoolsLease: the picker may create a Lease, but
// read and update only its pool's (the placeholder pool "pool").
func TestLeaseRuleNamesThePoolsLease(t *testing.T) {
	rules, _ := markerRules(t)
	if got := rules["coordination.k8s.io/leases"]; !slices.Equal(got, []string{"create"}) {
		t.Errorf("leases of any name: %v, want only create (RBAC cannot name a created object)", got)
	}
	if got := rules["coordination.k8s.io/leases[laneway-epp-pool]"]; !slices.Equal(got, []string{"get", "update"}) {
		t.Errorf("the pool's Lease laneway-epp-pool: %v, want get and update", got)
	}
}

// TestRBACGenerated compares role.yaml byte for byte with controller-gen's
// output, when controller-gen has been built (`make controller-gen`).
func TestRBACGenerated(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	gen := filepath.Join(root, "bin", "controller-gen")
	if _, err := os.Stat(gen); err != nil {
		t.Skip("bin/controller-gen not built (make controller-gen); TestRBACMatchesMarkers still checks the rules")
	}
	out := t.TempDir()
	cmd := exec.Command(gen, "rbac:roleName=laneway-epp", "paths=./internal/controller/...", "output:rbac:dir="+out)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("controller-gen: %v\n%s", err, b)
	}
	fresh, err := os.ReadFile(filepath.Join(out, "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile(filepath.Join(root, "config", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fresh, committed) {
		t.Fatalf("config/rbac/role.yaml is stale; run `make manifests`. controller-gen now writes:\n%s", fresh)
	}
}

// TestRBACBinding checks the ServiceAccount and RoleBinding that go with
// the Role: namespaced, and binding exactly that Role to that account.
func TestRBACBinding(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "config", "rbac")
	var sa corev1.ServiceAccount
	readYAML(t, filepath.Join(dir, "service_account.yaml"), &sa)
	var rb rbacv1.RoleBinding
	readYAML(t, filepath.Join(dir, "role_binding.yaml"), &rb)
	var role rbacv1.Role
	readYAML(t, filepath.Join(dir, "role.yaml"), &role)
	if sa.Kind != "ServiceAccount" || sa.Name != "laneway-epp" {
		t.Errorf("service_account.yaml is %s %q, want ServiceAccount laneway-epp", sa.Kind, sa.Name)
	}
	if rb.Kind != "RoleBinding" || rb.RoleRef.Kind != "Role" || rb.RoleRef.Name != role.Name {
		t.Errorf("role_binding.yaml is %s to %s %q, want a RoleBinding to Role %q", rb.Kind, rb.RoleRef.Kind, rb.RoleRef.Name, role.Name)
	}
	if len(rb.Subjects) != 1 || rb.Subjects[0].Kind != "ServiceAccount" || rb.Subjects[0].Name != sa.Name || rb.Subjects[0].Namespace != sa.Namespace {
		t.Errorf("role_binding.yaml subjects = %+v, want only ServiceAccount %s/%s", rb.Subjects, sa.Namespace, sa.Name)
	}
	if sa.Namespace != role.Namespace || rb.Namespace != role.Namespace {
		t.Errorf("namespaces differ: ServiceAccount %q, Role %q, RoleBinding %q", sa.Namespace, role.Namespace, rb.Namespace)
	}
}
