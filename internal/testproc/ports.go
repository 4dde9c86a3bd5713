package testproc

import (
	"fmt"
	"net"
	"strconv"
)

// FreePorts returns n distinct TCP ports that were free on ip a moment ago.
// The probes are held open together so the ports differ; another process
// may still take one before the caller binds it.
func FreePorts(ip string, n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	ports := make([]int, 0, n)
	for i := 0; i < n; i++ {
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			return nil, fmt.Errorf("probe a free port on %s: %w", ip, err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// FreePort returns one port that was free on ip a moment ago.
func FreePort(ip string) (int, error) {
	ports, err := FreePorts(ip, 1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// HostPort joins ip and port into an address.
func HostPort(ip string, port int) string { return net.JoinHostPort(ip, strconv.Itoa(port)) }
