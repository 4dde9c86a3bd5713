//go:build lanewayfaults

package fault

import "testing"

// TestFaultsWithTheTag: a build with the lanewayfaults tag panics exactly
// at the point the header names.
func TestFaultsWithTheTag(t *testing.T) {
	tests := []struct {
		name    string
		headers map[string]string
		point   string
		panics  bool
	}{
		{"the point named", map[string]string{Header: "decide"}, "decide", true},
		{"another point", map[string]string{Header: "decide"}, "after_grant", false},
		{"no header", map[string]string{}, "decide", false},
		{"no headers at all", nil, "request_body", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				if got := recover() != nil; got != tt.panics {
					t.Errorf("At(%q) with %v: panicked %v, want %v", tt.point, tt.headers, got, tt.panics)
				}
			}()
			At(tt.point, tt.headers)
		})
	}
}
