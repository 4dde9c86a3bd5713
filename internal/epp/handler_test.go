package epp

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/laneway-dev/laneway/pkg/drr"
	"github.com/laneway-dev/laneway/pkg/extproc"
	"github.com/laneway-dev/laneway/pkg/sched"
)

// TestReplyRetryAfter: the 429s of a class carry its queue-wait estimate;
// answers without a class leave retry-after to the server's default (0).
func TestReplyRetryAfter(t *testing.T) {
	h := &Handler{WaitEstimate: func(class string) time.Duration {
		if class == "busy" {
			return 3 * time.Second
		}
		return 0
	}}
	cases := []struct {
		name string
		err  error
		want time.Duration
	}{
		{"queue limit of a class with an estimate", &drr.Rejection{Class: "busy", Kind: drr.LimitRequests, Current: 8, Limit: 8}, 3 * time.Second},
		{"tenant limit", &drr.Rejection{Class: "busy", Tenant: "t", Kind: drr.LimitTenants, Current: 2, Limit: 2}, 3 * time.Second},
		{"queue limit of a class without one", &drr.Rejection{Class: "idle", Kind: drr.LimitRequests}, 0},
		{"shed", &sched.ShedError{Class: "busy", Waited: time.Second, Budget: time.Second}, 3 * time.Second},
		{"no endpoint", &sched.NoEndpointError{Filter: "x"}, 0},
		{"shutting down", sched.ErrShuttingDown, 0},
		{"other", errors.New("x"), 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var r *extproc.Reply
			if !errors.As(h.replyFor(tc.err), &r) {
				t.Fatalf("replyFor(%v) is no Reply", tc.err)
			}
			if r.RetryAfter != tc.want {
				t.Errorf("RetryAfter %s, want %s", r.RetryAfter, tc.want)
			}
		})
	}
}

// TestCachedEstimate: each class is read at most once per ttl.
func TestCachedEstimate(t *testing.T) {
	now := time.Unix(1000, 0)
	reads := map[string]int{}
	est := cachedEstimate(func(class string) time.Duration {
		reads[class]++
		return time.Duration(reads[class]) * time.Second
	}, time.Second, func() time.Time { return now })
	steps := []struct {
		advance time.Duration
		class   string
		want    time.Duration
	}{
		{0, "a", time.Second},
		{500 * time.Millisecond, "a", time.Second}, // cached
		{0, "b", time.Second},                      // its own entry
		{500 * time.Millisecond, "a", 2 * time.Second},
		{0, "b", time.Second},
	}
	for i, s := range steps {
		now = now.Add(s.advance)
		if got := est(s.class); got != s.want {
			t.Errorf("step %d (%s): %s, want %s", i, s.class, got, s.want)
		}
	}
}

// grantAcquirer answers every Acquire with a grant to endpoints, naming
// prefill as the prefill pod when set.
type grantAcquirer struct {
	endpoints []string
	prefill   string
}

func (a *grantAcquirer) Acquire(context.Context, *sched.Ticket) (*sched.Grant, error) {
	return sched.NewGrant(a.endpoints, a.prefill), nil
}

// TestDecidePrefillerHeader: a disaggregated grant names its prefill pod in
// x-prefiller-host-port; any other grant strips a client's own.
func TestDecidePrefillerHeader(t *testing.T) {
	body := []byte(`{"model":"m","prompt":"hello"}`)
	for _, tc := range []struct {
		name        string
		g           grantAcquirer
		client      bool
		wantHeaders []extproc.Header
		wantRemove  []string
	}{
		{"disaggregated", grantAcquirer{[]string{"10.0.0.2:8000"}, "10.0.0.1:8000"}, true,
			[]extproc.Header{{Name: sched.PrefillerHeader, Value: "10.0.0.1:8000"}}, nil},
		{"whole, client header stripped", grantAcquirer{[]string{"10.0.0.2:8000"}, ""}, true, nil, []string{sched.PrefillerHeader}},
		{"whole, nothing to strip", grantAcquirer{[]string{"10.0.0.2:8000"}, ""}, false, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &Handler{Parser: BodyParser{}, Dispatcher: &tc.g}
			req := &extproc.Request{Headers: map[string]string{":path": "/v1/completions"}, Body: body}
			if tc.client {
				req.Headers[sched.PrefillerHeader] = "6.6.6.6:1"
			}
			d, err := h.Decide(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(d.Headers, tc.wantHeaders) || !slices.Equal(d.RemoveHeaders, tc.wantRemove) {
				t.Errorf("headers %v remove %v, want %v and %v", d.Headers, d.RemoveHeaders, tc.wantHeaders, tc.wantRemove)
			}
		})
	}
}

// TestTenantName: a tenant's name is a copy of the identity, sharing no
// memory with the request's header block, and at most MaxTenantBytes: a
// longer identity keeps its first bytes at a character boundary and a
// hash of the whole, so two long identities remain two tenants.
func TestTenantName(t *testing.T) {
	block := "x-other-header-value" + "acme-prod"
	id := block[len(block)-len("acme-prod"):] // a header value: a slice of the block
	got := tenantName(id)
	if got != "acme-prod" || unsafe.StringData(got) == unsafe.StringData(id) {
		t.Errorf("tenantName(%q) = %q sharing the block: %t; want an equal copy", id, got, unsafe.StringData(got) == unsafe.StringData(id))
	}
	long := strings.Repeat("a", 300)
	other := strings.Repeat("a", 299) + "b"
	gl, go2 := tenantName(long), tenantName(other)
	if len(gl) != MaxTenantBytes || len(go2) != MaxTenantBytes || gl == go2 || gl[:236] != long[:236] || gl[236] != '~' {
		t.Errorf("long identities: %q and %q; want two distinct names of %d bytes, the first 236 kept", gl, go2, MaxTenantBytes)
	}
	wide := strings.Repeat("é", 150) // 300 bytes of two-byte characters
	if gw := tenantName(wide); len(gw) > MaxTenantBytes || !utf8.ValidString(gw) {
		t.Errorf("tenantName of 150 × é: %d bytes, valid UTF-8 %t; want at most %d and valid", len(gw), utf8.ValidString(gw), MaxTenantBytes)
	}
	if tenantName("") != "" {
		t.Error("the empty identity is not empty")
	}
}
