package epp

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/spf13/pflag"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/laneway-dev/laneway/pkg/extproc"
	"github.com/laneway-dev/laneway/pkg/sched"
)

func TestKubeOptions(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     string // POD_NAMESPACE
		kube    bool
		wantNS  string
		wantErr []string // substrings; empty means valid
	}{
		{name: "standalone by default", args: []string{"--endpoints=127.0.0.1:8000"}, wantNS: "default"},
		{name: "pool name selects Kubernetes mode", args: []string{"--pool-name=llama"}, kube: true, wantNS: "default"},
		{name: "namespace from POD_NAMESPACE", args: []string{"--pool-name=llama"}, env: "serving", kube: true, wantNS: "serving"},
		{name: "flag beats POD_NAMESPACE", args: []string{"--pool-name=llama", "--pool-namespace=other"}, env: "serving", kube: true, wantNS: "other"},
		{name: "endpoints and pool name exclude each other", args: []string{"--pool-name=llama", "--endpoints=127.0.0.1:8000"}, kube: true, wantNS: "default",
			wantErr: []string{"--endpoints and --pool-name"}},
		{name: "policy file and pool name exclude each other", args: []string{"--pool-name=llama", "--policy-config=p.yaml"}, kube: true, wantNS: "default",
			wantErr: []string{"--policy-config and --pool-name"}},
		{name: "bad names", args: []string{"--pool-name=Llama_3", "--pool-namespace=-x"}, kube: true, wantNS: "-x",
			wantErr: []string{`--pool-name: "Llama_3"`, `--pool-namespace: "-x"`}},
		{name: "other pool groups are refused", args: []string{"--pool-name=llama", "--pool-group=inference.networking.x-k8s.io"}, kube: true, wantNS: "default",
			wantErr: []string{"--pool-group"}},
		{name: "election timings must nest", args: []string{"--pool-name=llama", "--ha-enable-leader-election", "--leader-election-lease-duration=2s", "--leader-election-renew-deadline=2s"}, kube: true, wantNS: "default",
			wantErr: []string{"--leader-election-renew-deadline (2s) < --leader-election-lease-duration (2s)"}},
		{name: "renew deadline above the jittered retry", args: []string{"--pool-name=llama", "--ha-enable-leader-election", "--leader-election-renew-deadline=1s", "--leader-election-retry-period=900ms"}, kube: true, wantNS: "default",
			wantErr: []string{"1.2 × --leader-election-retry-period"}},
		{name: "timings are free without election", args: []string{"--pool-name=llama", "--leader-election-lease-duration=1s"}, kube: true, wantNS: "default"},
		{name: "status interval positive", args: []string{"--pool-name=llama", "--status-interval=0s"}, kube: true, wantNS: "default",
			wantErr: []string{"--status-interval"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("POD_NAMESPACE", tt.env)
			o := NewOptions()
			fs := pflag.NewFlagSet("epp", pflag.ContinueOnError)
			o.AddFlags(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			if err := o.Complete(); err != nil {
				t.Fatal(err)
			}
			if o.Kubernetes() != tt.kube {
				t.Errorf("Kubernetes() = %v, want %v", o.Kubernetes(), tt.kube)
			}
			if o.Kube.PoolNamespace != tt.wantNS {
				t.Errorf("pool namespace %q, want %q", o.Kube.PoolNamespace, tt.wantNS)
			}
			err := o.Validate()
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate passed, want errors %q", tt.wantErr)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestKubeDefaults(t *testing.T) {
	o := NewOptions()
	k := o.Kube
	if k.PoolGroup != DefaultPoolGroup || k.LeaseDuration != 15*time.Second || k.RenewDeadline != 10*time.Second || k.RetryPeriod != 2*time.Second {
		t.Fatalf("defaults %+v", k)
	}
}

// countingAcquirer records whether the handler reached the dispatcher.
type countingAcquirer struct{ calls int }

func (c *countingAcquirer) Acquire(context.Context, *sched.Ticket) (*sched.Grant, error) {
	c.calls++
	return nil, &sched.NoEndpointError{Filter: "test"}
}

func TestHandlerGate(t *testing.T) {
	tests := []struct {
		name       string
		gate       func() string
		wantReason string
		wantCalls  int
	}{
		{name: "no gate", gate: nil, wantReason: "no_endpoints", wantCalls: 1},
		{name: "open gate", gate: func() string { return "" }, wantReason: "no_endpoints", wantCalls: 1},
		{name: "invalid policy", gate: func() string { return ReasonPolicyInvalid }, wantReason: ReasonPolicyInvalid},
		{name: "not synced", gate: func() string { return ReasonNotReady }, wantReason: ReasonNotReady},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			acq := &countingAcquirer{}
			h := &Handler{Parser: BodyParser{}, Dispatcher: acq, Gate: tt.gate}
			_, err := h.Decide(context.Background(), &extproc.Request{Body: []byte(`{"model":"m","prompt":"hi"}`)})
			var r *extproc.Reply
			if !errors.As(err, &r) {
				t.Fatalf("Decide error %v, want a Reply", err)
			}
			if r.Status != http.StatusServiceUnavailable || r.Reason != tt.wantReason {
				t.Errorf("reply %d %s, want 503 %s", r.Status, r.Reason, tt.wantReason)
			}
			if acq.calls != tt.wantCalls {
				t.Errorf("dispatcher called %d times, want %d", acq.calls, tt.wantCalls)
			}
		})
	}
}

// TestReadinessGate: the gate opens once the controllers synced and a
// valid policy was applied; synced with the pool's policy objects invalid
// from the start it says policy_invalid, and opens once a valid set
// arrives; unsynced it stays not_ready; a gate stopped first leaves the
// server as it was.
func TestReadinessGate(t *testing.T) {
	tests := []struct {
		name             string
		synced, applied  bool
		applyLater       bool   // close applied after the gate logged awaitLog
		awaitLog         string // logged before the gate blocks; "" when it does not block or blocks at once
		stop             bool   // the gate waits: stop it
		wantReason       string
		wantReadyServing bool
	}{
		{name: "ready once synced with a valid policy", synced: true, applied: true, wantReason: "", wantReadyServing: true},
		{name: "invalid policy says policy_invalid", synced: true, awaitLog: "policy objects are invalid", stop: true, wantReason: ReasonPolicyInvalid},
		{name: "a valid policy later opens the gate", synced: true, awaitLog: "policy objects are invalid", applyLater: true, wantReason: "", wantReadyServing: true},
		{name: "unsynced stays not_ready", applied: true, stop: true, wantReason: ReasonNotReady},
	}
	closed := func(c bool) chan struct{} {
		ch := make(chan struct{})
		if c {
			close(ch)
		}
		return ch
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestServer(t, nil)
			logged := make(chan string, 4)
			log := funcr.New(func(_, args string) { logged <- args }, funcr.Options{})
			applied := closed(tt.applied)
			g := &readinessGate{srv: s, synced: closed(tt.synced), applied: applied, log: log}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- g.Start(ctx) }()
			if tt.awaitLog != "" {
				if l := <-logged; !strings.Contains(l, tt.awaitLog) {
					t.Fatalf("gate logged %s, want %q", l, tt.awaitLog)
				}
			}
			if tt.applyLater {
				close(applied)
			}
			if tt.stop {
				cancel()
			}
			if err := <-done; err != nil {
				t.Fatalf("Start: %v", err)
			}
			if got := s.gate(); got != tt.wantReason {
				t.Errorf("gate reason %q, want %q", got, tt.wantReason)
			}
			r, err := s.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: HealthReadiness})
			if err != nil {
				t.Fatal(err)
			}
			if serving := r.GetStatus() == healthpb.HealthCheckResponse_SERVING; serving != tt.wantReadyServing {
				t.Errorf("readiness %v, want serving %v", r.GetStatus(), tt.wantReadyServing)
			}
		})
	}
}

// TestReplicaLinkOptions: leader election needs the replica identity;
// --replica-leader is standalone and needs it too; the replica link is
// served with leader election, and standalone with an identity.
func TestReplicaLinkOptions(t *testing.T) {
	check := func(o *Options) error {
		if err := o.Complete(); err != nil {
			return err
		}
		return o.Validate()
	}
	for _, tc := range []struct {
		name    string
		set     func(*Options)
		wantErr string
		serves  bool
	}{
		{name: "election without an identity", set: func(o *Options) { o.Kube.PoolName, o.Kube.LeaderElection = "pool", true },
			wantErr: "--ha-enable-leader-election needs --replica-cert-path"},
		{name: "election", set: func(o *Options) { o.Kube.PoolName, o.Kube.LeaderElection, o.ReplicaCertPath = "pool", true, "/id" }, serves: true},
		{name: "Kubernetes without election", set: func(o *Options) { o.Kube.PoolName, o.ReplicaCertPath = "pool", "/id" }},
		{name: "standalone with an identity", set: func(o *Options) { o.ReplicaCertPath = "/id" }, serves: true},
		{name: "a fixed leader without an identity", set: func(o *Options) { o.ReplicaLeader = "10.0.0.1:9004" },
			wantErr: "--replica-leader needs --replica-cert-path"},
		{name: "a fixed leader in Kubernetes mode", set: func(o *Options) { o.Kube.PoolName, o.ReplicaCertPath, o.ReplicaLeader = "pool", "/id", "10.0.0.1:9004" },
			wantErr: "--replica-leader is for standalone mode"},
		{name: "a fixed leader", set: func(o *Options) { o.ReplicaCertPath, o.ReplicaLeader = "/id", "10.0.0.1:9004" }, serves: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := testOptions(tc.set)
			err := check(o)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Validate = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := o.ServesReplicaLink(); got != tc.serves {
				t.Errorf("ServesReplicaLink = %v, want %v", got, tc.serves)
			}
		})
	}
}
