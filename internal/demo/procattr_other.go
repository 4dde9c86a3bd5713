//go:build !linux

package demo

import "syscall"

func procAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }
