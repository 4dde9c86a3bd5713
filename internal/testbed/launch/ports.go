package launch

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

// FreePortOnAll returns a port that was free on every one of ips a moment
// ago: the pods of a pool all serve the pool's one target port, each on its
// own address.
func FreePortOnAll(ips []string) (int, error) {
	if len(ips) == 0 {
		return 0, fmt.Errorf("free port on no address")
	}
	for attempt := 0; attempt < 20; attempt++ {
		port, err := FreePort(ips[0])
		if err != nil {
			return 0, err
		}
		if freeOnAll(ips[1:], port) {
			return port, nil
		}
	}
	return 0, fmt.Errorf("no port free on every one of %v after 20 tries", ips)
}

// freeOnAll reports whether port can be bound on each of ips, holding the
// probes open together as a pool's servers will.
func freeOnAll(ips []string, port int) bool {
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for _, ip := range ips {
		l, err := net.Listen("tcp", HostPort(ip, port))
		if err != nil {
			return false
		}
		held = append(held, l)
	}
	return true
}
