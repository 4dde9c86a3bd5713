//go:build !linux

package h2client

import (
	"net"
	"sync/atomic"
)

// rxStampConn is Linux only (SO_TIMESTAMPNS on TCP); elsewhere Decision.Wire
// stays 0.
type rxStampConn struct {
	net.Conn
	last atomic.Int64
}

func newRxStampConn(*net.TCPConn) (*rxStampConn, error) { return nil, nil }
