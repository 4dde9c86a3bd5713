package extproc

// faultAt is called at points of the stream state machine with the
// request's headers. It does nothing: only a binary built with the
// lanewayfaults tag (fault_lanewayfaults.go, for the suites' fault tests)
// sets it, so no flag, header or environment can make a production build
// panic on purpose.
var faultAt func(point string, headers map[string]string)

// fault runs faultAt when the build has one.
func fault(point string, headers map[string]string) {
	if faultAt != nil {
		faultAt(point, headers)
	}
}
