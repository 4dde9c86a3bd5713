package policy

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/laneway-dev/laneway/api/v1alpha1"
	"github.com/laneway-dev/laneway/pkg/tokenize"
)

// FuzzLoadYAML: the loader never panics, and whatever it accepts compiles,
// resolves in range, and survives the round trip through objects.
func FuzzLoadYAML(f *testing.F) {
	for _, name := range sampleFiles {
		data, err := os.ReadFile(filepath.Join(samplesDir, name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		"", "~", "- a", "policy_classes: [{name: a, quantum: 1}]\n---\nx: 1",
		twoBuckets, "models: {m: {policy_classes: [{name: a, quantum: 1, busy_worker_ratio: .nan}]}}",
		"policy_classes: &a [{name: x, quantum: 1}]\nmodels: {m: {policy_classes: *a}}",
		"policy_classes: [{<<: {quantum: 1}, name: a}]",
	} {
		f.Add([]byte(s))
	}
	models, headers, uncached := resolveGrid()
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := LoadYAML(data)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		comp, err := cfg.Compile()
		if err != nil {
			t.Fatalf("LoadYAML accepted a config Compile refuses: %v", err)
		}
		for _, m := range append(models, cfg.modelNames()...) {
			for _, h := range append(headers, cfg.classNames()...) {
				for _, u := range uncached {
					if i := comp.Resolve(m, h, u); i < 0 || i >= len(comp.Classes) {
						t.Fatalf("Resolve(%q, %q, %d) = %d of %d classes", m, h, u, i, len(comp.Classes))
					}
				}
			}
		}
		prof, classes := ToObjects(cfg, "pool", "ns")
		var profs []v1alpha1.PolicyProfile
		if prof != nil {
			profs = append(profs, *prof)
		}
		oc := CheckObjects(profs, classes)
		if len(oc.Problems) > 0 {
			t.Fatalf("objects of a valid config are invalid: %v", oc.Problems)
		}
		if got, want := oc.Config.Canonical(), cfg.Canonical(); !reflect.DeepEqual(got, want) {
			t.Fatalf("round trip changed the model:\n got %+v\nwant %+v", got, want)
		}
	})
}

func (c *Config) modelNames() []string {
	var out []string
	for _, m := range c.Models {
		out = append(out, m.Model)
	}
	return out
}

func (c *Config) classNames() []string {
	var out []string
	for _, p := range append([]Profile{c.Root}, profilesOf(c.Models)...) {
		for _, cl := range p.Classes {
			out = append(out, cl.Name, cl.Family)
		}
	}
	return out
}

func profilesOf(ms []ModelProfile) []Profile {
	var out []Profile
	for _, m := range ms {
		out = append(out, m.Profile)
	}
	return out
}

// FuzzParseHints: body and header hints never panic, and a class header
// value that survives is trimmed and comma-free.
func FuzzParseHints(f *testing.F) {
	f.Add([]byte(`{"nvext":{"agent_hints":{"priority":10,"strict_priority":1,"osl":5,"speculative_prefill":true}}}`), "x-dynamo-meta-policy-class", " premium ")
	f.Add([]byte(`{"nvext":{"agent_hints":{"latency_sensitivity":-3}}}`), "x-laneway-priority", "-2147483648")
	f.Add([]byte(`{"nvext":5}`), "x-dynamo-request-strict-priority", "4294967295")
	f.Add([]byte(`[`), "X-Laneway-Policy-Class", "a, b")
	f.Add([]byte(``), "", "")
	f.Fuzz(func(t *testing.T, body []byte, name, value string) {
		var h Hints
		var f tokenize.Fields
		if _, err := tokenize.Extract(nil, body, &f); err == nil || errors.Is(err, tokenize.ErrNoPrompt) {
			h.ApplyAgentHints(f.Hints)
		}
		var hh HeaderHints
		isHint := hh.Observe(name, value)
		hh.Observe(name, value)
		hh.Apply(&h)
		if h.Class != "" {
			if !isHint || h.Class != strings.TrimSpace(h.Class) || strings.Contains(h.Class, ",") {
				t.Fatalf("class %q from header %q: %q", h.Class, name, value)
			}
		}
		if h.Priority != 0 && !h.HasPriority {
			t.Fatalf("priority %d without HasPriority", h.Priority)
		}
	})
}
