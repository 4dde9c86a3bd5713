package policy

import (
	"strings"
	"testing"

	"github.com/laneway-dev/laneway/api/v1alpha1"
)

func profileList(p *v1alpha1.PolicyProfile) []v1alpha1.PolicyProfile {
	if p == nil {
		return nil
	}
	return []v1alpha1.PolicyProfile{*p}
}

// The word forms of prefill_busy_threshold: what they load as, compile to
// and survive the PolicyClass round trip as, and what they refuse.
func TestBusyThresholdWords(t *testing.T) {
	tests := []struct {
		name, class string
		auto, queue bool
		err         string
	}{
		{name: "nothing written is auto", class: `{name: a, quantum: 1}`, auto: true, queue: true},
		{name: "auto", class: `{name: a, quantum: 1, prefill_busy_threshold: auto}`, auto: true, queue: true},
		{name: "none never queues", class: `{name: a, quantum: 1, prefill_busy_threshold: none}`},
		{name: "a number is not auto", class: `{name: a, quantum: 1, prefill_busy_threshold: 1536}`, queue: true},
		{name: "a fraction is not auto", class: `{name: a, quantum: 1, prefill_busy_threshold_frac: 1.0}`, queue: true},
		{name: "another word", class: `{name: a, quantum: 1, prefill_busy_threshold: sometimes}`, err: "want an integer, auto or none"},
		{name: "auto with a fraction", class: `{name: a, quantum: 1, prefill_busy_threshold: auto, prefill_busy_threshold_frac: 1.0}`, err: "cannot go with"},
		{name: "a ratio needs a written threshold", class: `{name: a, quantum: 1, busy_worker_ratio: 0.5}`, err: "busy_worker_ratio is set without a threshold"},
		{name: "none with a ratio", class: `{name: a, quantum: 1, prefill_busy_threshold: none, busy_worker_ratio: 0.5}`, err: "busy_worker_ratio is set without a threshold"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := LoadYAML([]byte("policy_classes:\n  - " + tt.class + "\n"))
			if err == nil {
				err = cfg.Validate()
			}
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c, err := cfg.Compile()
			if err != nil {
				t.Fatal(err)
			}
			if b := c.Busy[0]; b.Auto != tt.auto || b.Queueing() != tt.queue || c.Classes[0].Queueing != tt.queue {
				t.Fatalf("busy %+v (queueing %v), drr queueing %v; want auto %v queueing %v", b, b.Queueing(), c.Classes[0].Queueing, tt.auto, tt.queue)
			}
			profile, classes := ToObjects(cfg, "pool", "ns")
			back, problems := FromObjects(profileList(profile), classes)
			if len(problems) > 0 {
				t.Fatal(problems)
			}
			bc, err := back.Compile()
			if err != nil {
				t.Fatal(err)
			}
			if bc.Busy[0] != c.Busy[0] {
				t.Fatalf("round trip: %+v, want %+v", bc.Busy[0], c.Busy[0])
			}
		})
	}
}
