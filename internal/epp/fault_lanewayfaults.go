//go:build lanewayfaults

package epp

// headerTestFault names, in a binary built with the lanewayfaults tag only,
// the point at which the Handler panics ("decide", "after_grant").
const headerTestFault = "x-laneway-test-fault"

func init() {
	faultAt = func(point string, headers map[string]string) {
		if headers[headerTestFault] == point {
			panic("injected fault at " + point)
		}
	}
}
