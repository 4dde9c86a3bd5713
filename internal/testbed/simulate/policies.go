package simulate

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/laneway-dev/laneway/api/v1alpha1"
	"github.com/laneway-dev/laneway/pkg/policy"
	"github.com/laneway-dev/laneway/pkg/sched"
)

// Baseline names accepted by --policy.
const (
	// BaselineNone is no queueing (every class without a threshold) and
	// the least-loaded pick.
	BaselineNone = "none"
	// BaselineRoundRobin is what the upstream lightweight picker does: no
	// queueing, endpoints in turn.
	BaselineRoundRobin = "round-robin"
)

// Pickers of --picker (the policy files' runs; baselines have their own).
const (
	PickerPrefix      = "prefix"
	PickerLeastLoaded = "least-loaded"
)

// Policy is one run's scheduling configuration.
type Policy struct {
	// Name is the file name without its extension, or the baseline's.
	Name string
	// Config is the policy model; Compiled its compiled form.
	Config   *policy.Config
	Compiled *policy.Compiled
	// Picker is PickerPrefix, PickerLeastLoaded or BaselineRoundRobin.
	Picker string
	// Baseline is set for none and round-robin.
	Baseline bool
}

// Auto reports whether some class of the policy has an auto threshold.
func (p *Policy) Auto() bool {
	for _, b := range p.Compiled.Busy {
		if b.Auto {
			return true
		}
	}
	return false
}

// newPicker returns the picker of the policy's run.
func (p *Policy) newPicker(seed uint64) sched.Chooser {
	switch p.Picker {
	case PickerPrefix:
		return sched.NewCostChooser(1, seed)
	case BaselineRoundRobin:
		return &roundRobin{}
	}
	return sched.NewLeastLoaded(seed) // seeded: a run is deterministic for a seed
}

// roundRobin is the upstream lightweight picker's choice: the eligible
// endpoints in turn, blind to load and cache. It is a Picker for the real
// core, not a scheduler: admission, queueing and accounting stay the
// core's.
type roundRobin struct{ next int }

// Choose implements sched.Chooser.
func (r *roundRobin) Choose(_ *sched.Ticket, cands []sched.Candidate, out []int) []int {
	n := len(cands)
	start := r.next % n
	r.next = start + 1
	for i := range n {
		out = append(out, (start+i)%n)
	}
	return out
}

// LoadPolicyFile reads a policy: the reference router's YAML, or
// PolicyProfile and PolicyClass manifests as `laneway convert` writes them
// (multi-document YAML). Either is validated by the picker's own rules.
func LoadPolicyFile(path string) (*policy.Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read policy file: %w", err)
	}
	docs := splitYAML(data)
	manifests := false
	for _, d := range docs {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if yaml.Unmarshal(d, &head) == nil && head.Kind != "" && strings.HasPrefix(head.APIVersion, v1alpha1.GroupVersion.Group+"/") {
			manifests = true
		}
	}
	if !manifests {
		cfg, err := policy.LoadYAML(data)
		if err != nil {
			return nil, fmt.Errorf("policy file %s: %w", path, err)
		}
		return cfg, nil
	}
	var profiles []v1alpha1.PolicyProfile
	var classes []v1alpha1.PolicyClass
	for i, d := range docs {
		var head struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal(d, &head); err != nil {
			return nil, fmt.Errorf("policy file %s: document %d: %w", path, i+1, err)
		}
		switch head.Kind {
		case "PolicyProfile":
			var p v1alpha1.PolicyProfile
			if err := yaml.UnmarshalStrict(d, &p); err != nil {
				return nil, fmt.Errorf("policy file %s: document %d (PolicyProfile): %w", path, i+1, err)
			}
			profiles = append(profiles, p)
		case "PolicyClass":
			var c v1alpha1.PolicyClass
			if err := yaml.UnmarshalStrict(d, &c); err != nil {
				return nil, fmt.Errorf("policy file %s: document %d (PolicyClass): %w", path, i+1, err)
			}
			classes = append(classes, c)
		default:
			return nil, fmt.Errorf("policy file %s: document %d: kind %q is neither PolicyProfile nor PolicyClass", path, i+1, head.Kind)
		}
	}
	oc := policy.CheckObjects(profiles, classes)
	if len(oc.Problems) > 0 {
		return nil, fmt.Errorf("policy file %s: %w", path, oc.Problems)
	}
	return oc.Config, nil
}

// splitYAML splits a multi-document YAML stream at its "---" lines,
// dropping empty documents.
func splitYAML(data []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	flush := func() {
		if len(bytes.TrimSpace(cur.Bytes())) > 0 {
			docs = append(docs, slices.Clone(cur.Bytes()))
		}
		cur.Reset()
	}
	for _, line := range bytes.SplitAfter(data, []byte("\n")) {
		if t := bytes.TrimSpace(line); bytes.Equal(t, []byte("---")) || bytes.HasPrefix(t, []byte("--- ")) {
			flush()
			continue
		}
		cur.Write(line)
	}
	flush()
	return docs
}

// LoadPolicies resolves the --policy arguments: files (named by their
// base name without extension) and the baselines none and round-robin.
// The baselines keep the classes of the first policy file with every busy
// threshold removed, so their per-class figures compare with the files';
// without a file they have one explicit class per class header of the
// trace (or the synthetic class when the trace names none). picker is the
// files' picker.
func LoadPolicies(args []string, picker string, t *Trace) ([]*Policy, error) {
	if len(args) == 0 {
		args = []string{BaselineNone}
	}
	if picker != PickerPrefix && picker != PickerLeastLoaded {
		return nil, fmt.Errorf("--picker %q: want %s or %s", picker, PickerPrefix, PickerLeastLoaded)
	}
	var out []*Policy
	var reference *policy.Config
	seen := map[string]bool{}
	for _, a := range args {
		p := &Policy{Name: a, Picker: picker}
		switch a {
		case BaselineNone:
			p.Picker, p.Baseline = PickerLeastLoaded, true
		case BaselineRoundRobin:
			p.Picker, p.Baseline = BaselineRoundRobin, true
		default:
			cfg, err := LoadPolicyFile(a)
			if err != nil {
				return nil, err
			}
			p.Name = strings.TrimSuffix(filepath.Base(a), filepath.Ext(a))
			p.Config = cfg
			if reference == nil {
				reference = cfg
			}
		}
		if seen[p.Name] {
			return nil, fmt.Errorf("--policy %s: a second policy named %q (names are file names without the extension)", a, p.Name)
		}
		seen[p.Name] = true
		out = append(out, p)
	}
	if reference == nil {
		reference = traceClasses(t)
	}
	for _, p := range out {
		if p.Baseline {
			p.Config = withoutThresholds(reference)
		}
		c, err := p.Config.Compile()
		if err != nil {
			return nil, fmt.Errorf("policy %s: %w", p.Name, err)
		}
		p.Compiled = c
	}
	return out, nil
}

// traceClasses is a policy with one explicit class per class header the
// trace uses, in name order.
func traceClasses(t *Trace) *policy.Config {
	var names []string
	for i := range t.Requests {
		if c := t.Requests[i].Class; c != "" && nameRE.MatchString(c) && !slices.Contains(names, c) {
			names = append(names, c)
		}
	}
	slices.Sort(names)
	cfg := &policy.Config{}
	for _, n := range names {
		cfg.Root.Classes = append(cfg.Root.Classes, policy.Class{Name: n, QueuePolicy: policy.QueuePolicyFCFS, Quantum: 1})
	}
	return cfg
}

// withoutThresholds is c with no busy test anywhere (prefill_busy_threshold
// none, not the auto default): no class queues.
func withoutThresholds(c *policy.Config) *policy.Config {
	strip := func(p policy.Profile) policy.Profile {
		p.Classes = slices.Clone(p.Classes)
		for i := range p.Classes {
			cl := &p.Classes[i]
			cl.PrefillBusyThreshold, cl.PrefillBusyThresholdFrac, cl.BusyWorkerRatio = nil, nil, nil
			cl.BusyMode = policy.BusyNone
			cl.MaxQueueWait = 0
		}
		return p
	}
	out := &policy.Config{Root: strip(c.Root)}
	for _, m := range c.Models {
		out.Models = append(out.Models, policy.ModelProfile{Model: m.Model, Profile: strip(m.Profile)})
	}
	return out
}

// NewPolicy compiles a policy model for a run under the given name with
// the given picker (PickerPrefix, PickerLeastLoaded or
// BaselineRoundRobin).
func NewPolicy(name string, cfg *policy.Config, pickerName string) (*Policy, error) {
	c, err := cfg.Compile()
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", name, err)
	}
	return &Policy{Name: name, Config: cfg, Compiled: c, Picker: pickerName}, nil
}
