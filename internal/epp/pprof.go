package epp

import (
	"net/http"
	"net/http/pprof"
	"time"
)

// pprofServer serves the net/http/pprof handlers (opt-in with
// --pprof-port, for profiling under load). The Server runs it on a
// listener of its own, so the metrics port never exposes them.
func pprofServer() *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
}
