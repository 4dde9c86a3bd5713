package launch

import "syscall"

// procAttr makes a child die with its parent, so an interrupted test or
// demo leaves no picker or model server behind.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
