//go:build linux

package h2client

import (
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// rxStampConn reads a TCP connection with recvmsg and keeps the kernel's
// receive timestamp (SO_TIMESTAMPNS, CLOCK_REALTIME) of the newest segment
// each read returned, or the read's own time when the kernel stamped none. A frame parsed after a read arrived no later than that
// read's timestamp, so latency taken to it is an upper bound of the time the
// answer was on the wire, without the load tool's own wake-up and queueing.
type rxStampConn struct {
	*net.TCPConn
	rc   syscall.RawConn
	oob  []byte
	last atomic.Int64 // Unix ns of the newest received segment
}

func newRxStampConn(tc *net.TCPConn) (*rxStampConn, error) {
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_TIMESTAMPNS, 1)
	}); err != nil {
		return nil, err
	}
	if serr != nil {
		return nil, serr
	}
	return &rxStampConn{TCPConn: tc, rc: rc, oob: make([]byte, syscall.CmsgSpace(timespecLen))}, nil
}

func (c *rxStampConn) Read(p []byte) (int, error) {
	var n, oobn int
	var rerr error
	err := c.rc.Read(func(fd uintptr) bool {
		n, oobn, _, _, rerr = syscall.Recvmsg(int(fd), p, c.oob, 0)
		return rerr != syscall.EAGAIN
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		return 0, err
	}
	if n == 0 && len(p) > 0 {
		return 0, io.EOF
	}
	ts := parseTimestampNS(c.oob[:oobn])
	if ts == 0 {
		// Linux turns receive stamping on through deferred work: on a busy
		// machine the first segments after SO_TIMESTAMPNS come unstamped.
		// The read's own time bounds their arrival too (later, never
		// earlier); keeping the previous stamp would bound it too early.
		ts = time.Now().UnixNano()
	}
	c.last.Store(ts)
	return n, nil
}

// timespecLen is the size of SCM_TIMESTAMPNS's payload, a struct timespec
// of the platform's width.
const timespecLen = int(unsafe.Sizeof(syscall.Timespec{}))

// parseTimestampNS finds SCM_TIMESTAMPNS in a control buffer without
// allocating and returns it in Unix nanoseconds, or 0.
func parseTimestampNS(b []byte) int64 {
	hdr := int(unsafe.Sizeof(syscall.Cmsghdr{}))
	for len(b) >= hdr {
		h := (*syscall.Cmsghdr)(unsafe.Pointer(&b[0]))
		l := int(h.Len)
		if l < hdr || l > len(b) {
			return 0
		}
		if h.Level == syscall.SOL_SOCKET && h.Type == syscall.SCM_TIMESTAMPNS && l >= syscall.CmsgLen(timespecLen) {
			var ts syscall.Timespec
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&ts)), timespecLen), b[syscall.CmsgLen(0):])
			return ts.Nano()
		}
		b = b[min(syscall.CmsgSpace(l-syscall.CmsgLen(0)), len(b)):]
	}
	return 0
}
