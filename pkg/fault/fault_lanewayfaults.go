//go:build lanewayfaults

package fault

// Header names, in a binary built with the lanewayfaults tag only, the
// point at which handling the request panics.
const Header = "x-laneway-test-fault"

// At panics when the request's Header names point.
func At(point string, headers map[string]string) {
	if headers[Header] == point {
		panic("injected fault at " + point)
	}
}
