//go:build !linux

package e2e

import "syscall"

func procAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }
