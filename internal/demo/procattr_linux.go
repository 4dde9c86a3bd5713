package demo

import "syscall"

// procAttr makes a child die with the demo, so an interrupted demo leaves
// no process behind.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
