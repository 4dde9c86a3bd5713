//go:build lanewayfaults

package extproc

// HeaderTestFault names, in a binary built with the lanewayfaults tag
// only, the point at which handling the request panics ("request_body",
// "response_headers"), so the suites can show a fault stays contained.
const HeaderTestFault = "x-laneway-test-fault"

func init() {
	faultAt = func(point string, headers map[string]string) {
		if headers[HeaderTestFault] == point {
			panic("injected fault at " + point)
		}
	}
}
