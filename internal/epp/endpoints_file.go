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

// ParseEndpoints reads the contents of an --endpoints-file: ip:port
// entries, one per line or several separated by commas, with blank lines
// and everything after a # ignored. Every entry must be an ip:port; the
// error names each one that is not, with its line.
func ParseEndpoints(data []byte) ([]string, error) {
	var eps []string
	var errs []error
	for n, line := range strings.Split(string(data), "\n") {
		line, _, _ = strings.Cut(line, "#")
		for _, ep := range strings.Split(line, ",") {
			ep = strings.TrimSpace(ep)
			if ep == "" {
				continue
			}
			if err := checkEndpoint(ep); err != nil {
				errs = append(errs, fmt.Errorf("line %d: %q is not ip:port: %w", n+1, ep, err))
				continue
			}
			eps = append(eps, ep)
		}
	}
	return eps, errors.Join(errs...)
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
func standaloneEndpoints(opts *Options) (eps []sched.Endpoint, data []byte, err error) {
	addrs := opts.Endpoints
	if path := opts.EndpointsFile; path != "" {
		if data, err = os.ReadFile(path); err != nil {
			return nil, nil, fmt.Errorf("--endpoints-file: %w", err)
		}
		if addrs, err = ParseEndpoints(data); err != nil {
			return nil, nil, fmt.Errorf("--endpoints-file %s: %w", path, err)
		}
	}
	return StaticEndpoints(addrs, opts.MaxNumBatchedTokens), data, nil
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
		addrs, err := ParseEndpoints(data)
		if err != nil {
			log.Error(err, "endpoints file rejected; the previous endpoints stay in use", "path", path)
			return
		}
		d.SetEndpoints(StaticEndpoints(addrs, opts.MaxNumBatchedTokens))
		log.Info("endpoints file reloaded", "path", path, "endpoints", len(addrs))
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
