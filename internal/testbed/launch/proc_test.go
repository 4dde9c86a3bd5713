package launch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"
)

// childEnv makes the test binary act as the child process of these tests.
const childEnv = "TESTPROC_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "":
		os.Exit(m.Run())
	case "term0": // a well-behaved server: drains on SIGTERM, exits 0
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGTERM)
		fmt.Println("child up")
		<-ch
		fmt.Println("child draining")
		os.Exit(0)
	case "exit3":
		fmt.Println("child failing")
		os.Exit(3)
	case "stuck": // ignores SIGTERM; SIGQUIT's goroutine dump ends it
		signal.Ignore(syscall.SIGTERM)
		fmt.Println("child stuck")
		select {}
	}
}

func startChild(t *testing.T, mode string) *Proc {
	t.Helper()
	p, err := Start(Options{Name: "child " + mode, Bin: os.Args[0], Env: append(os.Environ(), childEnv+"="+mode)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

func TestStop(t *testing.T) {
	tests := []struct {
		mode        string
		wantErr     bool
		notStopped  bool
		exitErr     bool
		wantLogLine string
	}{
		{mode: "term0", wantLogLine: "child draining"},
		{mode: "exit3", wantErr: true, exitErr: true, wantLogLine: "child failing"},
		{mode: "stuck", wantErr: true, notStopped: true, wantLogLine: "goroutine "},
	}
	for _, tc := range tests {
		t.Run(tc.mode, func(t *testing.T) {
			p := startChild(t, tc.mode)
			// Stop only once the child has installed its handlers.
			select {
			case <-p.Log.Await("child "):
			case <-time.After(30 * time.Second):
				t.Fatalf("child printed nothing: %q", p.Log)
			}
			err := p.Stop(2 * time.Second)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Stop = %v, want error %t", err, tc.wantErr)
			}
			var ee *exec.ExitError
			if got := errors.As(err, &ee); got != tc.exitErr {
				t.Errorf("Stop error %v wraps *exec.ExitError: %t, want %t", err, got, tc.exitErr)
			}
			if got := errors.Is(err, ErrNotStopped); got != tc.notStopped {
				t.Errorf("Stop error %v is ErrNotStopped: %t, want %t", err, got, tc.notStopped)
			}
			if !strings.Contains(p.Log.String(), tc.wantLogLine) {
				t.Errorf("log %q lacks %q", p.Log, tc.wantLogLine)
			}
			if p.Exited() == nil {
				t.Error("Exited() = nil after Stop")
			}
		})
	}
}

func TestLog(t *testing.T) {
	tests := []struct {
		name   string
		limit  int
		writes []string
		await  string
		want   string // line Await delivers; "" means none
		kept   string
	}{
		{name: "line split over writes", writes: []string{"a\nserv", "ing on :1\n"}, await: "serving", want: "serving on :1", kept: "a\nserving on :1\n"},
		{name: "already kept", writes: []string{"serving on :2\nb\n"}, await: "serving", want: "serving on :2", kept: "serving on :2\nb\n"},
		{name: "unfinished line is not delivered", writes: []string{"serving on"}, await: "serving", kept: "serving on"},
		{name: "head kept past the limit, lines still seen", limit: 4, writes: []string{"abcd\n", "serving\n"}, await: "serving", want: "serving", kept: "abcd\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := &Log{Limit: tc.limit}
			var ch <-chan string
			if !strings.Contains(tc.name, "already") {
				ch = l.Await(tc.await)
			}
			for _, w := range tc.writes {
				if _, err := l.Write([]byte(w)); err != nil {
					t.Fatal(err)
				}
			}
			if ch == nil {
				ch = l.Await(tc.await)
			}
			var got string
			select {
			case got = <-ch:
			default:
			}
			if got != tc.want {
				t.Errorf("Await(%q) = %q, want %q", tc.await, got, tc.want)
			}
			if l.String() != tc.kept {
				t.Errorf("kept %q, want %q", l.String(), tc.kept)
			}
		})
	}
}

func TestFreePorts(t *testing.T) {
	ports, err := FreePorts("127.0.0.1", 3)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p <= 0 || seen[p] {
			t.Fatalf("ports %v: want 3 distinct positive ports", ports)
		}
		seen[p] = true
	}
}

func TestPoll(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	closedPort := refusingPort(t)
	tests := []struct {
		name    string
		check   Check
		wantErr bool
	}{
		{"http 200", HTTPOK(srv.URL + "/health"), false},
		{"http 404", HTTPOK(srv.URL + "/other"), true},
		{"tcp open", TCPOpen(srv.Listener.Addr().String()), false},
		{"tcp closed", TCPOpen(HostPort("127.0.0.1", closedPort)), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Poll(context.Background(), nil, tc.name, 200*time.Millisecond, tc.check)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Poll = %v, want error %t", err, tc.wantErr)
			}
		})
	}
}

// refusingPort returns a loopback port that refuses connections for the
// whole test: a socket bound to it without listening (and without
// SO_REUSEADDR) keeps every other process, including the test packages
// running beside this one, from listening there. A port merely freed
// before use can be taken by one of them in between (CI saw it once).
func refusingPort(t *testing.T) int {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return sa.(*syscall.SockaddrInet4).Port
}

func TestPollGivesUpWhenTheProcessExits(t *testing.T) {
	p := startChild(t, "exit3")
	addr := HostPort("127.0.0.1", refusingPort(t))
	err := Poll(context.Background(), p, "child", time.Minute, TCPOpen(addr))
	if err == nil || !strings.Contains(err.Error(), "exited") {
		t.Fatalf("Poll = %v, want the exit reported", err)
	}
	err = WaitGRPCServing(context.Background(), p, addr, "readiness", nil, time.Minute)
	if err == nil || !strings.Contains(err.Error(), "exited") {
		t.Fatalf("WaitGRPCServing = %v, want the exit reported", err)
	}
}

func TestRefusingPortCannotBeTaken(t *testing.T) {
	port := refusingPort(t)
	ln, err := net.Listen("tcp", HostPort("127.0.0.1", port))
	if err == nil {
		ln.Close()
		t.Fatalf("listened on port %d held by refusingPort; another test package could take it too", port)
	}
}
