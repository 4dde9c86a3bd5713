package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

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

// FuzzParseDPRank: a rank bound parses to 0 <= lo <= hi <= MaxDPRank or
// not at all, and a parsed one prints back to a string that parses the
// same.
func FuzzParseDPRank(f *testing.F) {
	for _, s := range []string{"0", "3", "1-4", " 2 - 7 ", "65536", "65537", "-1", "+1", "4-2", "1-", "-", "1--2", "0x1", "1e3", "00012"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		lo, hi, ok := ParseDPRank(s)
		if !ok {
			if lo != 0 || hi != 0 {
				t.Fatalf("ParseDPRank(%q) = %d, %d, false; want zeros when not ok", s, lo, hi)
			}
			return
		}
		if lo < 0 || lo > hi || hi > MaxDPRank {
			t.Fatalf("ParseDPRank(%q) = %d-%d, outside 0 <= lo <= hi <= %d", s, lo, hi, MaxDPRank)
		}
		if lo2, hi2, ok2 := ParseDPRank(fmt.Sprintf("%d-%d", lo, hi)); !ok2 || lo2 != lo || hi2 != hi {
			t.Fatalf("%d-%d from %q does not parse back: %d-%d %v", lo, hi, s, lo2, hi2, ok2)
		}
	})
}

// FuzzFromObjects: any PolicyProfile and PolicyClass objects (their JSON,
// as the API server would hand them over after a schema it may not
// enforce) convert without a panic, and what converts without problems
// either fails validation with problems or compiles.
func FuzzFromObjects(f *testing.F) {
	f.Add([]byte(`{"spec":{"poolRef":{"name":"p"},"defaultPolicyFamily":"std","tenants":[{"name":"a","match":{"exact":["x"]},"allowed":["std"]}],"defaultTenant":{"allowed":["std"]}}}`),
		[]byte(`{"spec":{"poolRef":{"name":"p"},"family":"std","quantum":1,"prefillBusyThresholdFrac":"0.5","busyWorkerRatio":"2"}}`))
	f.Add([]byte(`{"spec":{"models":[{"model":"m","uncachedISLBuckets":[{"name":"b","minTokens":0}]}],"identity":{"metadata":{"namespace":"n","path":["a"]}}}}`),
		[]byte(`{"metadata":{"name":"c"},"spec":{"maxQueueWait":"1s","prefillBusyThresholdFrac":"x","cacheBucket":"b","models":["m"]}}`))
	f.Fuzz(func(t *testing.T, profile, class []byte) {
		var p v1alpha1.PolicyProfile
		var c v1alpha1.PolicyClass
		if json.Unmarshal(profile, &p) != nil || json.Unmarshal(class, &c) != nil {
			return
		}
		cfg, ps := FromObjects([]v1alpha1.PolicyProfile{p}, []v1alpha1.PolicyClass{c})
		if len(ps) > 0 || cfg == nil {
			return
		}
		if err := cfg.Validate(); err != nil {
			var probs Problems
			if !errors.As(err, &probs) || len(probs) == 0 {
				t.Fatalf("Validate: %v, want Problems", err)
			}
			return
		}
		if _, err := cfg.Compile(); err != nil {
			t.Fatalf("a valid converted policy does not compile: %v", err)
		}
	})
}

// parseBudget is how long a parse of n bytes may take: a few milliseconds
// per kilobyte, and a floor for the scheduler of a loaded machine. A file
// or body that takes longer is a finding (issue 22: 78 KB of YAML aliases
// took 74 s).
func parseBudget(n int) time.Duration {
	return 100*time.Millisecond + time.Duration(n)*5*time.Millisecond/1024
}

// fastestOf3 returns the fastest of three runs of fn: one run can be slow for
// the machine's reasons; three slow runs are the input's.
func fastestOf3(fn func()) time.Duration {
	best := time.Duration(1<<63 - 1)
	for range 3 {
		start := time.Now()
		fn()
		best = min(best, time.Since(start))
		if best < 10*time.Millisecond {
			break
		}
	}
	return best
}

// FuzzParseTime bounds the time a policy file and a request body take to
// read: at most parseBudget, whatever the bytes (aliases, nesting, long
// strings, many duplicates).
func FuzzParseTime(f *testing.F) {
	f.Add([]byte("policy_classes: &a [{name: x, quantum: 1}]\nmodels: {m: {policy_classes: *a}, n: {policy_classes: *a}}"), []byte(`{"prompt":"x"}`))
	f.Add([]byte("tenants:\n  - {name: t0, match: {exact: &b [a, b, c, d]}}\n  - {name: t1, match: {exact: *b}}\n"), []byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`))
	f.Add([]byte("a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"), []byte(`[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]`))
	f.Fuzz(func(t *testing.T, policy, body []byte) {
		if d := fastestOf3(func() { _, _ = LoadYAML(policy) }); d > parseBudget(len(policy)) {
			t.Fatalf("a %d-byte policy took %v to load, more than %v", len(policy), d, parseBudget(len(policy)))
		}
		var fields tokenize.Fields
		if d := fastestOf3(func() { _, _ = tokenize.Extract(nil, body, &fields) }); d > parseBudget(len(body)) {
			t.Fatalf("a %d-byte body took %v to read, more than %v", len(body), d, parseBudget(len(body)))
		}
	})
}
