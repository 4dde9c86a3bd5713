package launch

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync/atomic"
	"syscall"
	"time"
)

// QuitGrace is how long Stop and Quit wait after SIGQUIT (the Go runtime
// then prints every goroutine and exits) before they kill.
const QuitGrace = 5 * time.Second

// ErrNotStopped is wrapped by Stop's error when the process outlived its
// grace period and had to be ended with SIGQUIT or SIGKILL.
var ErrNotStopped = errors.New("did not exit within the grace period of SIGTERM")

// Options describe one process to start.
type Options struct {
	// Name names the process in errors ("epp", "modelsim 127.0.0.2:8000").
	Name string
	// Bin is the executable; Args its arguments.
	Bin  string
	Args []string
	// Env is the whole environment; nil inherits this process's.
	Env []string
	// LogLimit bounds the kept output (Log.Limit); 0 keeps all of it.
	LogLimit int
	// Output, when set, also receives the process's output (a file, a
	// terminal).
	Output io.Writer
}

// Proc is a started process. Its output goes to Log; a goroutine reaps it,
// so Done closes when it has exited.
type Proc struct {
	// Name is Options.Name.
	Name string
	// Cmd is the started command; read Cmd.ProcessState only after Done.
	Cmd *exec.Cmd
	// Log holds its standard output and error.
	Log *Log

	done    chan struct{}
	waitErr error // written before done closes
	// failureOK is set by Kill and ExpectFailure: a non-zero exit is what
	// the caller asked for, not a failed shutdown (see watch).
	failureOK atomic.Bool
}

// Start starts the process with its output captured and, on Linux, a
// parent-death signal so it never outlives the caller.
func Start(o Options) (*Proc, error) {
	p := &Proc{Name: o.Name, Log: &Log{Limit: o.LogLimit}, done: make(chan struct{})}
	p.Cmd = exec.Command(o.Bin, o.Args...)
	p.Cmd.Env = o.Env
	var out io.Writer = p.Log
	if o.Output != nil {
		out = io.MultiWriter(p.Log, o.Output)
	}
	p.Cmd.Stdout, p.Cmd.Stderr = out, out
	p.Cmd.SysProcAttr = procAttr()
	if err := p.Cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", o.Name, o.Bin, err)
	}
	go func() {
		p.waitErr = p.Cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Done is closed once the process has exited and been reaped.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited returns nil while the process runs, else an error saying how it
// ended, with the tail of its log.
func (p *Proc) Exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited (%v)\n%s", p.Name, p.Cmd.ProcessState, p.Log.Tail(4000))
	default:
		return nil
	}
}

// ExitErr waits for the exit and returns nil when the status was 0, else an
// error wrapping the *exec.ExitError (errors.As finds it).
func (p *Proc) ExitErr() error {
	<-p.done
	if p.waitErr != nil {
		return fmt.Errorf("%s exited with %v: %w", p.Name, p.Cmd.ProcessState, p.waitErr)
	}
	return nil
}

// Signal sends sig unless the process has already exited.
func (p *Proc) Signal(sig os.Signal) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := p.Cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal %v to %s: %w", sig, p.Name, err)
	}
	return nil
}

// Stop sends SIGTERM and waits up to grace for the exit. A process still
// running then gets SIGQUIT (a Go program prints every goroutine, so the
// log shows what held it up), then SIGKILL after QuitGrace; the error wraps
// ErrNotStopped. Otherwise it returns ExitErr. Calling it again returns the
// same outcome.
func (p *Proc) Stop(grace time.Duration) error {
	_ = p.Signal(syscall.SIGTERM)
	return p.Wait(grace)
}

// Wait waits up to limit for an exit the caller has asked for (a signal
// already sent) and returns ExitErr; past limit it ends the process as Stop
// does and returns an error wrapping ErrNotStopped.
func (p *Proc) Wait(limit time.Duration) error {
	select {
	case <-p.done:
		return p.ExitErr()
	case <-time.After(limit):
	}
	p.Quit()
	return fmt.Errorf("%s %w (%s); stopped with SIGQUIT (goroutine dump in its log)", p.Name, ErrNotStopped, limit)
}

// Quit makes a running process print its goroutines and exit (Go's SIGQUIT
// behaviour), killing it after QuitGrace, and waits for it.
func (p *Proc) Quit() {
	_ = p.Signal(syscall.SIGQUIT)
	select {
	case <-p.done:
	case <-time.After(QuitGrace):
		p.kill()
	}
}

// Kill sends SIGKILL (no drain, no clean-up in the process) and waits. The
// exit it causes is the caller's doing, so a watched process's cleanup
// does not report it (see ExpectFailure).
func (p *Proc) Kill() {
	p.ExpectFailure()
	p.kill()
}

func (p *Proc) kill() {
	_ = p.Signal(syscall.SIGKILL)
	<-p.done
}

// ExpectFailure marks a non-zero exit as what the caller expects (a
// deposed leader exits 1 so that it restarts): the cleanup of a Run* start
// then only reaps the process.
func (p *Proc) ExpectFailure() { p.failureOK.Store(true) }
