package ha

import (
	"context"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

func TestHolderIdentity(t *testing.T) {
	tests := []struct {
		id         string
		addr, tag  string
		ok         bool
		roundTrips bool // built by holderIdentity from addr and tag
	}{
		{id: "epp-7d9f-x2k_10.0.0.5:9002_0123456789abcdef", addr: "10.0.0.5:9002", tag: "0123456789abcdef", ok: true, roundTrips: true},
		{id: "epp_[fd00::5]:9002_ab", addr: "[fd00::5]:9002", tag: "ab", ok: true, roundTrips: true},
		{id: "intruder"},
		{id: "a_b"},
		{id: "pod_10.0.0.5_tag"}, // no port
		{id: "pod__tag"},
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			addr, tag, ok := parseHolder(tt.id)
			if ok != tt.ok || addr != tt.addr || tag != tt.tag {
				t.Errorf("parseHolder(%q) = %q, %q, %v; want %q, %q, %v", tt.id, addr, tag, ok, tt.addr, tt.tag, tt.ok)
			}
			if tt.roundTrips {
				name := tt.id[:strings.IndexByte(tt.id, '_')]
				if got := holderIdentity(name, tt.addr, tt.tag); got != tt.id {
					t.Errorf("holderIdentity = %q, want %q", got, tt.id)
				}
			}
		})
	}
}

func TestLeaseName(t *testing.T) {
	if got := LeaseName("llama"); got != "laneway-epp-llama" {
		t.Fatalf("LeaseName = %q", got)
	}
}

func TestAdvertiseAddr(t *testing.T) {
	host, _ := os.Hostname()
	tests := []struct {
		bound, podIP, want string
	}{
		{bound: "127.0.0.1:9002", want: "127.0.0.1:9002"},
		{bound: "127.0.0.1:9002", podIP: "10.1.2.3", want: "10.1.2.3:9002"},
		{bound: "[::]:9002", want: net.JoinHostPort(host, "9002")},
		{bound: "0.0.0.0:41234", podIP: "fd00::7", want: "[fd00::7]:41234"},
	}
	for _, tt := range tests {
		t.Setenv("POD_IP", tt.podIP)
		addr, err := net.ResolveTCPAddr("tcp", tt.bound)
		if err != nil {
			t.Fatal(err)
		}
		if got := advertiseAddr(addr); got != tt.want {
			t.Errorf("advertiseAddr(%s) with POD_IP %q = %q, want %q", tt.bound, tt.podIP, got, tt.want)
		}
	}
}

// fakeLock is a resourcelock.Interface whose Get returns rec.
type fakeLock struct {
	resourcelock.Interface
	rec resourcelock.LeaderElectionRecord
}

func (l *fakeLock) Get(context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	r := l.rec
	return &r, nil, nil
}

// TestObservedLockFreshness: a holder is known while its record was seen
// changing within the lease duration; one not seen renewed for that long,
// a released Lease, or none at all is no leader.
func TestObservedLockFreshness(t *testing.T) {
	now := time.Unix(1000, 0)
	fl := &fakeLock{}
	l := &observedLock{Interface: fl, lease: 15 * time.Second, now: func() time.Time { return now }}
	get := func() {
		if _, _, err := l.Get(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if h := l.holder(); h != "" {
		t.Fatalf("holder before any read = %q", h)
	}
	renew := func(holder string, at time.Time) {
		fl.rec = resourcelock.LeaderElectionRecord{HolderIdentity: holder, LeaseDurationSeconds: 3, RenewTime: metav1.NewTime(at)}
		get()
	}
	renew("a", now)
	if h := l.holder(); h != "a" {
		t.Fatalf("holder after a renewal = %q, want a", h)
	}
	now = now.Add(2 * time.Second)
	get() // the same record again: not a renewal
	if h := l.holder(); h != "a" {
		t.Fatalf("holder 2 s after the renewal = %q, want a", h)
	}
	now = now.Add(time.Second)
	get()
	if h := l.holder(); h != "" {
		t.Fatalf("holder 3 s (the record's lease) after the last renewal seen = %q, want none", h)
	}
	renew("a", now)
	if h := l.holder(); h != "a" {
		t.Fatalf("holder after a new renewal = %q, want a", h)
	}
	fl.rec = resourcelock.LeaderElectionRecord{LeaseDurationSeconds: 1, RenewTime: metav1.NewTime(now.Add(time.Millisecond))}
	get() // released
	if h := l.holder(); h != "" {
		t.Fatalf("holder of a released Lease = %q", h)
	}
}

// TestElectorTerms: a term reports leadership while it lasts; a term whose
// start callback runs only after it ended (client-go starts it on a
// goroutine of its own) never does; a stop after a release is not logged
// as lost.
func TestElectorTerms(t *testing.T) {
	leading := make(chan struct{}, 2)
	lead := func(ctx context.Context) error { leading <- struct{}{}; return nil }
	e, err := NewElector(ElectorConfig{Lock: &fakeLock{}, Identity: "me_127.0.0.1:1_ab",
		LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
		Lead: lead, Registry: prometheus.NewRegistry(), Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	term, end := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.startedLeading(term); close(done) }()
	<-leading // the leader's work runs once leadership is set
	if !e.IsLeader() {
		t.Fatal("IsLeader() during a term: not leading")
	}
	end()
	<-done
	e.stoppedLeading(false)
	if h, leading := e.Leader(), e.IsLeader(); leading || h != "" {
		t.Fatalf("Leader(), IsLeader() after the term = %q, %v", h, leading)
	}

	late, endLate := context.WithCancel(context.Background())
	endLate()
	e.stoppedLeading(false)
	e.startedLeading(late)
	if e.IsLeader() {
		t.Fatal("a term started after its end reports leadership")
	}
	if len(leading) != 0 {
		t.Fatal("a term started after its end ran the leader's work")
	}
}

// FuzzParseHolder: a Lease holder string is anyone's to write (whoever
// may update the Lease), and a follower dials what it names. parseHolder
// never panics; what it accepts is a host and port that net.SplitHostPort
// takes, and the identity this replica builds from its parts parses back
// to them.
func FuzzParseHolder(f *testing.F) {
	for _, s := range []string{"epp-0_10.0.0.7:9002_0123456789abcdef0123456789abcdef", "a_[fd00::1]:9002_x", "_:_", "a__b", "a_b_c_d", "", "___", "a_host:1_", "a_10.0.0.1_t"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		addr, tag, ok := parseHolder(id)
		if !ok {
			return
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			t.Fatalf("parseHolder(%q) accepted address %q: %v", id, addr, err)
		}
		if strings.Contains(tag, "_") {
			t.Fatalf("parseHolder(%q): tag %q holds the separator", id, tag)
		}
		a2, t2, ok2 := parseHolder(holderIdentity("pod", addr, tag))
		if !ok2 || a2 != addr || t2 != tag {
			t.Fatalf("identity of %q, %q parses to %q, %q, %v", addr, tag, a2, t2, ok2)
		}
	})
}
