package epp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/laneway-dev/laneway/internal/dispatcher"
	"github.com/laneway-dev/laneway/pkg/sched"
)

// FileEndpoint is one entry of an --endpoints-file: the address and the
// role the entry gives it (prefill-decode when it names none).
type FileEndpoint struct {
	Addr string
	Role sched.Role
}

// ParseEndpointsFile reads the contents of an --endpoints-file: entries of
// an ip:port, optionally followed by a role (prefill, decode,
// prefill-decode, or the deprecated both) after white space, one per line
// or several separated by commas, with blank lines and everything after a
// # ignored. Every entry must start with an ip:port and hold at most a
// role besides; the error names each one that does not, with its line. An
// unknown role is not an error: the entry serves whole requests
// (prefill-decode) and a warning names it.
func ParseEndpointsFile(data []byte) (eps []FileEndpoint, warnings []string, err error) {
	var errs []error
	for n, line := range strings.Split(string(data), "\n") {
		line, _, _ = strings.Cut(line, "#")
		for _, entry := range strings.Split(line, ",") {
			f := strings.Fields(entry)
			if len(f) == 0 {
				continue
			}
			if len(f) > 2 {
				errs = append(errs, fmt.Errorf("line %d: %q: want ip:port and at most a role", n+1, strings.TrimSpace(entry)))
				continue
			}
			if err := checkEndpoint(f[0]); err != nil {
				errs = append(errs, fmt.Errorf("line %d: %q is not ip:port: %w", n+1, f[0], err))
				continue
			}
			e := FileEndpoint{Addr: f[0]}
			if len(f) == 2 {
				r, err := sched.ParseRole(f[1])
				if err != nil {
					warnings = append(warnings, fmt.Sprintf("line %d: %s: %v", n+1, f[0], err))
				}
				e.Role = r
			}
			eps = append(eps, e)
		}
	}
	return eps, warnings, errors.Join(errs...)
}

// ParseEndpoints is ParseEndpointsFile's addresses alone.
func ParseEndpoints(data []byte) ([]string, error) {
	eps, _, err := ParseEndpointsFile(data)
	addrs := make([]string, 0, len(eps))
	for _, e := range eps {
		addrs = append(addrs, e.Addr)
	}
	if len(addrs) == 0 {
		addrs = nil
	}
	return addrs, err
}

// checkEndpoint accepts an IP address and a port from 1 to 65535:
// net.SplitHostPort alone let "foo:bar" and "[::1]:x" through, which the
// picker then dialled (and scraped) forever.
func checkEndpoint(ep string) error {
	ap, err := netip.ParseAddrPort(ep)
	if err != nil {
		return err
	}
	if ap.Port() == 0 {
		return errors.New("port 0")
	}
	return nil
}

// standaloneEndpoints is the standalone mode's first endpoint set: the
// --endpoints-file's, else --endpoints. data is the file's content it was
// parsed from (nil without the file), the version watchEndpoints starts
// from: a change made after this read is then the first one it applies.
func standaloneEndpoints(opts *Options, log logr.Logger) (eps []sched.Endpoint, data []byte, err error) {
	path := opts.EndpointsFile
	if path == "" {
		return StaticEndpoints(opts.Endpoints, opts.MaxNumBatchedTokens), nil, nil
	}
	if data, err = os.ReadFile(path); err != nil {
		return nil, nil, fmt.Errorf("--endpoints-file: %w", err)
	}
	entries, warnings, err := ParseEndpointsFile(data)
	if err != nil {
		return nil, nil, fmt.Errorf("--endpoints-file %s: %w", path, err)
	}
	logRoleWarnings(log, path, warnings)
	return FileEndpoints(entries, opts.MaxNumBatchedTokens), data, nil
}

// logRoleWarnings logs each unknown role of an endpoints file.
func logRoleWarnings(log logr.Logger, path string, warnings []string) {
	for _, w := range warnings {
		log.Info("warning: endpoints file role not understood", "path", path, "entry", w)
	}
}

// FileEndpoints is the endpoint set of an endpoints file: StaticEndpoints
// of its addresses, each with its role.
func FileEndpoints(entries []FileEndpoint, maxBatched uint64) []sched.Endpoint {
	addrs := make([]string, len(entries))
	for i, e := range entries {
		addrs[i] = e.Addr
	}
	eps := StaticEndpoints(addrs, maxBatched)
	for i := range eps {
		eps[i].Role = entries[i].Role
	}
	return eps
}

// watchEndpoints polls the endpoints file and hands each valid version
// that differs from initial (the content of the first set)
// to the dispatcher, which treats it as the pool's pods changing in
// Kubernetes mode (SPEC §8): removed endpoints take no new requests, those
// already sent there finish. A version that does not parse is logged once
// and ignored; the last good set stays.
func watchEndpoints(ctx context.Context, opts *Options, initial []byte, d *dispatcher.Dispatcher, log logr.Logger) {
	path := opts.EndpointsFile
	pollFile(ctx, path, initial, opts.PolicyPollInterval, func(data []byte) {
		entries, warnings, err := ParseEndpointsFile(data)
		if err != nil {
			log.Error(err, "endpoints file rejected; the previous endpoints stay in use", "path", path)
			return
		}
		logRoleWarnings(log, path, warnings)
		d.SetEndpoints(FileEndpoints(entries, opts.MaxNumBatchedTokens))
		log.Info("endpoints file reloaded", "path", path, "endpoints", len(entries))
	})
}

// pollFile reads path every interval until ctx ends and calls changed
// with each content that differs from the one before (initial, at first).
// Polling, not inotify, also sees the symlink swap of a Kubernetes
// ConfigMap volume; a file that cannot be read is skipped until it can.
func pollFile(ctx context.Context, path string, initial []byte, every time.Duration, changed func([]byte)) {
	last := initial
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		data, err := os.ReadFile(path)
		if err != nil || bytes.Equal(data, last) {
			continue
		}
		last = data
		changed(data)
	}
}
