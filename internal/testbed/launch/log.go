package launch

import (
	"bytes"
	"strings"
	"sync"
)

// Log collects a process's output while tests read it: the process writes
// from exec's copying goroutine. It keeps the head of the output up to
// Limit bytes (start-up and first errors explain most failures; 0 keeps
// everything) and hands every complete line, kept or not, to the waiters
// of Await.
type Log struct {
	// Limit is the number of bytes kept; 0 means no limit. Set it before
	// the first Write.
	Limit int

	mu      sync.Mutex
	buf     bytes.Buffer
	partial []byte // the unfinished last line, for the waiters
	waiters []logWaiter
}

type logWaiter struct {
	substr string
	ch     chan string
}

// Write keeps p (up to Limit) and passes each completed line to the waiters.
func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.Limit <= 0 || l.buf.Len() < l.Limit {
		l.buf.Write(p)
	}
	if len(l.waiters) == 0 {
		// Nobody waits: only the unfinished line must be remembered.
		if i := bytes.LastIndexByte(p, '\n'); i >= 0 {
			l.partial = append(l.partial[:0], p[i+1:]...)
		} else {
			l.partial = append(l.partial, p...)
		}
		return len(p), nil
	}
	rest := p
	for {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			l.partial = append(l.partial, rest...)
			break
		}
		line := string(append(l.partial, rest[:i]...))
		l.partial = l.partial[:0]
		rest = rest[i+1:]
		l.notify(line)
	}
	return len(p), nil
}

// notify hands line to the waiters whose substring it contains.
func (l *Log) notify(line string) {
	kept := l.waiters[:0]
	for _, w := range l.waiters {
		if strings.Contains(line, w.substr) {
			w.ch <- line // buffered, written once
			continue
		}
		kept = append(kept, w)
	}
	l.waiters = kept
}

// Await returns a channel that receives the first complete line containing
// substr: one already kept, or else the next one written.
func (l *Log) Await(substr string) <-chan string {
	ch := make(chan string, 1)
	l.mu.Lock()
	defer l.mu.Unlock()
	kept := l.buf.Bytes()
	if i := bytes.LastIndexByte(kept, '\n'); i >= 0 {
		for _, line := range strings.Split(string(kept[:i]), "\n") {
			if strings.Contains(line, substr) {
				ch <- line
				return ch
			}
		}
	}
	l.waiters = append(l.waiters, logWaiter{substr: substr, ch: ch})
	return ch
}

// String returns the kept output.
func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// Tail returns the last n bytes of the kept output, marked when cut.
func (l *Log) Tail(n int) string { return Tail(l.String(), n) }

// Tail returns the last n bytes of s, with a "...\n" mark when it cut.
func Tail(s string, n int) string {
	if len(s) > n {
		return "...\n" + s[len(s)-n:]
	}
	return s
}
