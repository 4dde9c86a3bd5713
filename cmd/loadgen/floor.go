package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/internal/testbed/load"
)

// The floor is load.FloorProcessor in a process of its own: loadgen runs
// itself with serveFloorArg, so the floor needs no build step and, like the
// picker, shares nothing with the load tool but the machine.
const (
	serveFloorArg = "--serve-floor" // =addr: serve the floor there and nothing else
	floorTLSArg   = "--serve-floor-tls"
	floorEndArg   = "--serve-floor-endpoint" // =ip:port the floor picks
)

// floorName and floorLabel name the floor's results.
const floorName = "floor"

const floorLabel = "floor (grpc-go ext_proc server that only answers; this machine's transport floor)"

// maybeServeFloor serves the floor and exits when loadgen was started as
// one; it returns otherwise. It runs before loadgen's own flags and
// GOMAXPROCS, so the floor keeps the GOMAXPROCS its environment gives it,
// as the picker does.
func maybeServeFloor() {
	var addr, endpoint string
	secure := false
	for _, a := range os.Args[1:] {
		if v, ok := strings.CutPrefix(a, serveFloorArg+"="); ok {
			addr = v
		} else if v, ok := strings.CutPrefix(a, floorEndArg+"="); ok {
			endpoint = v
		} else if a == floorTLSArg {
			secure = true
		}
	}
	if addr == "" {
		return
	}
	if err := serveFloor(addr, endpoint, secure); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen floor:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func serveFloor(addr, endpoint string, secure bool) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv, err := load.NewFloorServer(endpoint, secure)
	if err != nil {
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sig
		srv.Stop()
	}()
	return srv.Serve(lis)
}

// spawnFloor starts the floor on a free loopback port, routing to the
// spawned idle endpoint, and connects to it as run does to Laneway.
func spawnFloor(ctx context.Context, f *flags) (*picker, func(), error) {
	self, err := os.Executable()
	if err != nil {
		return nil, nil, fmt.Errorf("floor: %w", err)
	}
	port, err := launch.FreePort("127.0.0.1")
	if err != nil {
		return nil, nil, fmt.Errorf("floor: %w", err)
	}
	addr := launch.HostPort("127.0.0.1", port)
	args := []string{serveFloorArg + "=" + addr, floorEndArg + "=" + spawnedEndpoint}
	var creds credentials.TransportCredentials
	if f.tls {
		args = append(args, floorTLSArg)
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // self-signed, loopback
	}
	p, err := launch.Start(launch.Options{Name: floorName, Bin: self, Args: args, LogLimit: 64 << 10})
	if err != nil {
		return nil, nil, fmt.Errorf("floor: %w", err)
	}
	stop := func() {
		if err := p.Stop(10 * time.Second); err != nil {
			fmt.Fprintf(os.Stderr, "loadgen: floor: %v\n", err)
		}
	}
	if err := launch.WaitGRPCServing(ctx, p, addr, "", creds, 30*time.Second); err != nil {
		stop()
		return nil, nil, fmt.Errorf("floor: %w", err)
	}
	fmt.Fprintf(os.Stderr, "loadgen: spawned floor pid %d, ext_proc %s (tls %v), routing to %s\n",
		p.Cmd.Process.Pid, addr, f.tls, spawnedEndpoint)
	ref, closeConns, err := connect(ctx, f, floorName, floorLabel, addr, load.ProcCPU(p.Cmd.Process.Pid))
	if err != nil {
		stop()
		return nil, nil, err
	}
	return ref, func() { closeConns(); stop() }, nil
}
