package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// proc is a child process whose output is kept for failure messages.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *logBuffer
	done chan struct{}
	err  error
}

// logBuffer keeps the head of a process's output (its start-up and first
// errors are what explain a failure).
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

const maxLog = 4 << 20

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() < maxLog {
		l.b.Write(p)
	}
	return len(p), nil
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startProc starts bin with args and env added to the test's environment.
func startProc(name, bin string, args, env []string) (*proc, error) {
	p := &proc{name: name, out: &logBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = procAttr()
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	return p, nil
}

// exited reports whether the process is gone, with its log.
func (p *proc) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited: %v\n%s", p.name, p.err, tail(p.out.String(), 4000))
	default:
		return nil
	}
}

// stop sends SIGTERM and waits up to grace for a clean exit, then kills.
// It returns an error unless the process exited 0 within grace.
func (p *proc) stop(grace time.Duration) error {
	select {
	case <-p.done:
		return p.exitErr()
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.exitErr()
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not stop within %s after SIGTERM; killed", p.name, grace)
	}
}

func (p *proc) exitErr() error {
	var ee *exec.ExitError
	if p.err != nil && !errors.As(p.err, &ee) {
		return fmt.Errorf("%s: %w", p.name, p.err)
	}
	if p.err != nil {
		return fmt.Errorf("%s exited with %v\n%s", p.name, p.err, tail(p.out.String(), 4000))
	}
	return nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
