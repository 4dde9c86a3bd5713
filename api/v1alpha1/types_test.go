package v1alpha1_test

import (
	"regexp"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/laneway-dev/laneway/api/v1alpha1"
)

func TestSchemeRegistration(t *testing.T) {
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"PolicyClass", "PolicyClassList", "PolicyProfile", "PolicyProfileList"} {
		if !s.Recognizes(v1alpha1.GroupVersion.WithKind(kind)) {
			t.Errorf("scheme does not know %s", kind)
		}
	}
}

func TestEffectiveClassName(t *testing.T) {
	c := &v1alpha1.PolicyClass{ObjectMeta: metav1.ObjectMeta{Name: "obj"}}
	if got := c.EffectiveClassName(); got != "obj" {
		t.Errorf("without className: %q", got)
	}
	c.Spec.ClassName = "Gold"
	if got := c.EffectiveClassName(); got != "Gold" {
		t.Errorf("with className: %q", got)
	}
}

// TestPatterns checks the exported patterns, which the markers repeat.
func TestPatterns(t *testing.T) {
	tests := []struct {
		pattern string
		good    []string
		bad     []string
	}{
		{v1alpha1.DecimalPattern, []string{"0", "1", "0.5", ".5", "5.", "1.5e3", "1e-05", "10"}, []string{"", "-1", "a", "1.2.3", "e5", "+1", "NaN", "Inf"}},
		{v1alpha1.DurationPattern, []string{"0", "30s", "1m30s", "1.5h", "100ms", "2h0m0s"}, []string{"", "-1s", "5", "1d", "s"}},
		{v1alpha1.ClassNamePattern, []string{"a", "Gold_1.x-y"}, []string{"", "a b", "a/b", "é"}},
	}
	for _, tt := range tests {
		re := regexp.MustCompile(tt.pattern)
		for _, s := range tt.good {
			if !re.MatchString(s) {
				t.Errorf("%s rejects %q", tt.pattern, s)
			}
		}
		for _, s := range tt.bad {
			if re.MatchString(s) {
				t.Errorf("%s accepts %q", tt.pattern, s)
			}
		}
	}
}
