package e2e

import "syscall"

// procAttr makes a child die with the test binary, so an interrupted run
// leaves no picker or model server behind.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
