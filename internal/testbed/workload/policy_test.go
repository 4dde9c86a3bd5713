package workload

import (
	"testing"

	"github.com/laneway-dev/laneway/pkg/policy"
)

// TestPolicyYAML loads the policy with the picker's own loader, so a typo in
// the text fails here rather than as a picker that will not start.
func TestPolicyYAML(t *testing.T) {
	tests := []struct {
		premium, regular uint64
	}{
		{512, 128},
		{512, 512},
	}
	for _, tc := range tests {
		cfg, err := policy.LoadYAML([]byte(PolicyYAML(tc.premium, tc.regular)))
		if err != nil {
			t.Fatalf("PolicyYAML(%d, %d): %v", tc.premium, tc.regular, err)
		}
		p := cfg.Root
		if p.DefaultFamily != "regular" {
			t.Errorf("default family %q, want regular", p.DefaultFamily)
		}
		want := map[string]int64{"premium": int64(tc.premium), "regular": int64(tc.regular)}
		if len(p.Classes) != len(want) {
			t.Fatalf("classes %+v, want premium and regular", p.Classes)
		}
		for _, c := range p.Classes {
			if c.Quantum != want[c.Name] || c.Family != c.Name || c.Bucket != "all" || c.QueuePolicy != "fcfs" {
				t.Errorf("class %+v, want quantum %d, family %s, bucket all, fcfs", c, want[c.Name], c.Name)
			}
			if c.PrefillBusyThreshold == nil || *c.PrefillBusyThreshold != 1536 {
				t.Errorf("class %s prefill busy threshold %v, want 1536", c.Name, c.PrefillBusyThreshold)
			}
		}
	}
}
