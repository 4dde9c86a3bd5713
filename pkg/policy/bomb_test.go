package policy

import (
	"fmt"
	"strings"
	"testing"
)

// aliasBomb is the audit's shape of policy: one anchored list reused by
// alias in every tenant binding, so a file of a few tens of kilobytes
// stands for millions of nodes. elem is the list's element: a string (a
// valid policy) or a mapping (each expanded element is an error).
func aliasBomb(listLen, bindings int, elem string) string {
	var b strings.Builder
	b.WriteString("policy_classes: [{name: std, quantum: 1}]\ntenants:\n")
	b.WriteString("  - name: t0\n    match: {exact: &big [")
	for i := range listLen {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, elem, i)
	}
	b.WriteString("]}\n    allowed: [std]\n")
	for i := 1; i < bindings; i++ {
		fmt.Fprintf(&b, "  - {name: t%d, match: {exact: *big}, allowed: [std]}\n", i)
	}
	return b.String()
}

// TestAliasBombs: a policy file that reuses anchors costs work in
// proportion to its size, not to its expansion. The audit's 78 KB file of
// aliases took laneway validate 74 s and the picker 4.3 s and 334 MB to
// load, with 358 MB of error text for an invalid variant. Such a file is
// refused for its expansion, with a short error, after a bounded walk.
func TestAliasBombs(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       string
	}{
		{"valid strings", aliasBomb(1000, 2000, "t%d"), "aliases expand"},
		{"invalid elements", aliasBomb(1000, 2000, "{x: %d}"), "aliases expand"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadYAML([]byte(tc.yaml))
			if err == nil {
				t.Fatalf("a %d-byte file of aliases loaded", len(tc.yaml))
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.want) {
				t.Errorf("error does not say %q: %.300s", tc.want, msg)
			}
			if len(msg) > 64<<10 {
				t.Errorf("%d bytes of error text for a %d-byte file, want at most 64 KiB", len(msg), len(tc.yaml))
			}
		})
	}
}

// TestListsBoundedAsTheCRDs: the YAML file's lists have the bounds the
// CRDs' schemas give the same fields, so a file cannot hold what the API
// server would refuse.
func TestListsBoundedAsTheCRDs(t *testing.T) {
	list := func(n int, f string) string {
		s := make([]string, n)
		for i := range s {
			s[i] = fmt.Sprintf(f, i)
		}
		return "[" + strings.Join(s, ", ") + "]"
	}
	tests := []struct {
		name, yaml, want string
	}{
		{"allowed", "policy_classes: [{name: c0, quantum: 1}]\ndefault_tenant: {allowed: " + list(1025, "c%d") + ", default_family: c0}\n", "default_tenant.allowed: more than 1024 entries"},
		{"exact", "tenants: [{name: t, match: {exact: " + list(10001, "u%d") + "}}]\n", "tenants[0].match.exact: more than 10000 entries"},
		{"prefix", "tenants: [{name: t, match: {prefix: " + list(1001, "u%d") + "}}]\n", "tenants[0].match.prefix: more than 1000 entries"},
		{"metadata path", "identity: {metadata: {namespace: jwt, path: " + list(17, "k%d") + "}}\n", "identity.metadata.path: more than 16 entries"},
		{"buckets", "uncached_isl_buckets: " + list(33, "{min_tokens: %d, bucket: b}") + "\n", "uncached_isl_buckets: more than 32 entries"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseYAML([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseYAML: %.300v, want %q", err, tc.want)
			}
		})
	}
}
