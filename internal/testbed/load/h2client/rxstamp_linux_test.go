//go:build linux

package h2client

import (
	"net"
	"syscall"
	"testing"
	"time"
)

// TestRxStampReadWithoutKernelStamp: a read that brings no SCM_TIMESTAMPNS
// still bounds the arrival. Linux turns receive stamping on through
// deferred work, so on a busy machine the first segments after
// SO_TIMESTAMPNS is set come unstamped; such a read must leave its own
// time, not nothing (a decision then had no wire time) or an older stamp
// (an arrival bound earlier than the arrival).
func TestRxStampReadWithoutKernelStamp(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stamped bool // SO_TIMESTAMPNS set, as newRxStampConn does
	}{
		{"option never set", false},
		{"option set", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			write := make(chan struct{})
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				for range write {
					_, _ = c.Write([]byte("frame"))
				}
			}()
			nc, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			defer close(write)
			tcp := nc.(*net.TCPConn)
			var r *rxStampConn
			if tc.stamped {
				if r, err = newRxStampConn(tcp); err != nil {
					t.Fatal(err)
				}
			} else {
				rc, err := tcp.SyscallConn()
				if err != nil {
					t.Fatal(err)
				}
				r = &rxStampConn{TCPConn: tcp, rc: rc, oob: make([]byte, syscall.CmsgSpace(timespecLen))}
			}
			// Two reads: the second's bound must not be the first's.
			var prev int64
			for i := 0; i < 2; i++ {
				sent := time.Now().UnixNano()
				write <- struct{}{}
				buf := make([]byte, 16)
				if _, err := r.Read(buf); err != nil {
					t.Fatal(err)
				}
				got := r.last.Load()
				if got < sent || got > time.Now().UnixNano() || got <= prev {
					t.Fatalf("read %d: arrival bound %d, want within [%d, now] and after the previous %d", i, got, sent, prev)
				}
				prev = got
			}
		})
	}
}
