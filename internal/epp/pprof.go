package epp

import (
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// ServePprof serves the net/http/pprof handlers on addr (opt-in with
// --pprof-port, for profiling under load) on their own listener, so the
// metrics port never exposes them. It returns the bound address and a
// function that closes the server.
func ServePprof(addr string) (string, func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("pprof listener on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }() // ends with ErrServerClosed at stop
	return ln.Addr().String(), func() { _ = srv.Close() }, nil
}
