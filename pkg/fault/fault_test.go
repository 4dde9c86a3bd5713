//go:build !lanewayfaults

package fault

import "testing"

// TestNoFaultsWithoutTheTag: a build without the lanewayfaults tag never
// panics, whatever the request says.
func TestNoFaultsWithoutTheTag(t *testing.T) {
	for _, point := range []string{"request_body", "response_headers", "decide", "after_grant"} {
		At(point, map[string]string{"x-laneway-test-fault": point})
	}
}
