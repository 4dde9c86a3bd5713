//go:build !lanewayfaults

package fault

// At does nothing: this build has no fault injection (see the package
// documentation).
func At(point string, headers map[string]string) {}
