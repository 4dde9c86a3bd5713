//go:build !linux

package launch

import "syscall"

// procAttr has no parent-death signal to set outside Linux.
func procAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }
