package epp

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/laneway-dev/laneway/pkg/sched"
)

func TestParseEndpoints(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []string
		wantErr []string
	}{
		{name: "empty"},
		{name: "comments only", in: "# none yet\n\n   # still none\n"},
		{name: "one per line", in: "10.0.0.1:8000\n10.0.0.2:8000\n", want: []string{"10.0.0.1:8000", "10.0.0.2:8000"}},
		{name: "commas, spaces and trailing comments", in: " 10.0.0.1:8000 , 10.0.0.2:8000 # rack a\r\n[fd00::1]:8000", want: []string{"10.0.0.1:8000", "10.0.0.2:8000", "[fd00::1]:8000"}},
		{name: "bad entries named with their lines", in: "10.0.0.1:8000\n10.0.0.2\n\nhost:1:2\n", want: []string{"10.0.0.1:8000"},
			wantErr: []string{`line 2: "10.0.0.2"`, `line 4: "host:1:2"`}},
		// The audit's probe: a host name or a port that is not a number
		// split as host:port, and the picker dialled them.
		{name: "a host name, a port that is no number, port 0", in: "foo:bar\n[::1]:x\nmodel-0:8000\n10.0.0.1:0\n10.0.0.1:65536\n[::1]:8000", want: []string{"[::1]:8000"},
			wantErr: []string{`line 1: "foo:bar"`, `line 2: "[::1]:x"`, `line 3: "model-0:8000"`, `line 4: "10.0.0.1:0"`, `line 5: "10.0.0.1:65536"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseEndpoints([]byte(tc.in))
			if !slices.Equal(got, tc.want) {
				t.Errorf("endpoints %q, want %q", got, tc.want)
			}
			if len(tc.wantErr) == 0 && err != nil {
				t.Fatalf("error %v", err)
			}
			for _, w := range tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error %v does not contain %s", err, w)
				}
			}
		})
	}
}

// TestParseEndpointsFileRoles: an entry may name its role after the
// address; an unknown one serves whole requests with a warning.
func TestParseEndpointsFileRoles(t *testing.T) {
	in := "10.0.0.1:8000 prefill\n10.0.0.2:8000   decode , 10.0.0.3:8000 both # mixed\n10.0.0.4:8000\n10.0.0.5:8000 prefil\n10.0.0.6:8000 decode extra\n"
	got, warnings, err := ParseEndpointsFile([]byte(in))
	want := []FileEndpoint{
		{"10.0.0.1:8000", sched.RolePrefill}, {"10.0.0.2:8000", sched.RoleDecode}, {"10.0.0.3:8000", sched.RolePrefillDecode},
		{"10.0.0.4:8000", sched.RolePrefillDecode}, {"10.0.0.5:8000", sched.RolePrefillDecode},
	}
	if !slices.Equal(got, want) {
		t.Errorf("entries %v, want %v", got, want)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], `line 4: 10.0.0.5:8000: unknown role "prefil"`) {
		t.Errorf("warnings %q, want one for the unknown role", warnings)
	}
	if err == nil || !strings.Contains(err.Error(), `line 5: "10.0.0.6:8000 decode extra"`) {
		t.Errorf("error %v, want one naming the entry with an extra field", err)
	}
	eps := FileEndpoints(want[:2], 4096)
	if eps[0].Role != sched.RolePrefill || eps[1].Role != sched.RoleDecode || eps[1].MaxBatchedTokens != 4096 {
		t.Errorf("FileEndpoints = %+v", eps)
	}
}

func TestEndpointsFileOptions(t *testing.T) {
	tests := []struct {
		name      string
		configure func(*Options)
		wantErr   string
	}{
		{name: "file alone", configure: func(o *Options) { o.EndpointsFile = "eps" }},
		{name: "with --endpoints", configure: func(o *Options) { o.EndpointsFile, o.Endpoints = "eps", []string{"10.0.0.1:80"} },
			wantErr: "--endpoints and --endpoints-file exclude each other"},
		{name: "with --pool-name", configure: func(o *Options) { o.EndpointsFile, o.Kube.PoolName = "eps", "llm" },
			wantErr: "--endpoints-file and --pool-name exclude each other"},
		{name: "no poll interval", configure: func(o *Options) { o.EndpointsFile, o.PolicyPollInterval = "eps", 0 },
			wantErr: "--policy-poll-interval: 0s must be positive"},
		{name: "no poll interval, nothing to poll", configure: func(o *Options) { o.PolicyPollInterval = -time.Second }},
		{name: "--endpoints foo:bar", configure: func(o *Options) { o.Endpoints = []string{"foo:bar"} },
			wantErr: `--endpoints: "foo:bar" is not ip:port`},
		{name: "--endpoints [::1]:x", configure: func(o *Options) { o.Endpoints = []string{"[::1]:x"} },
			wantErr: `--endpoints: "[::1]:x" is not ip:port`},
		{name: "--endpoints [::1]:8000", configure: func(o *Options) { o.Endpoints = []string{"[::1]:8000", "10.0.0.1:80"} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := testOptions(tc.configure).Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Validate: %v, want %q", err, tc.wantErr)
			}
		})
	}
	if _, _, err := standaloneEndpoints(testOptions(func(o *Options) { o.EndpointsFile = t.TempDir() + "/missing" }), logr.Discard()); err == nil ||
		!strings.Contains(err.Error(), "--endpoints-file") {
		t.Errorf("a missing endpoints file: %v, want an error naming --endpoints-file", err)
	}
}

// FuzzParseEndpoints: every entry ParseEndpointsFile returns is an IP
// address and a port from 1 to 65535 with one of the three roles, an
// unknown role costs at most one warning per entry, ParseEndpoints returns
// the same addresses, and the result, written back with its roles, parses
// again to itself without a warning.
func FuzzParseEndpoints(f *testing.F) {
	for _, s := range []string{"", "10.0.0.1:8000\n10.0.0.2:8000", " 10.0.0.1:8000 , [fd00::1]:8000 # x\r\n", "foo:bar", "[::1]:x",
		"10.0.0.1:0", "[fe80::1%eth0]:80", "1.2.3.4:65536", "::1:80", "#only\n,,,\n",
		"10.0.0.1:8000 prefill\n10.0.0.2:8000\tdecode , [fd00::1]:8000 both", "10.0.0.1:8000 PreFill-Decode", "10.0.0.1:8000 prefil",
		"10.0.0.1:8000 decode extra", "foo:bar prefill", "decode 10.0.0.1:8000"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		eps, warnings, err := ParseEndpointsFile(data)
		for _, e := range eps {
			ap, perr := netip.ParseAddrPort(e.Addr)
			if perr != nil || ap.Port() == 0 {
				t.Fatalf("accepted %q: %v, port %d", e.Addr, perr, ap.Port())
			}
			if e.Role != sched.RolePrefillDecode && e.Role != sched.RolePrefill && e.Role != sched.RoleDecode {
				t.Fatalf("%q has role %v", e.Addr, e.Role)
			}
		}
		if len(warnings) > len(eps) {
			t.Fatalf("%d warnings for %d entries: %q", len(warnings), len(eps), warnings)
		}
		addrs, aerr := ParseEndpoints(data)
		if len(addrs) != len(eps) || (aerr == nil) != (err == nil) {
			t.Fatalf("ParseEndpoints = %q, %v; ParseEndpointsFile = %v, %v", addrs, aerr, eps, err)
		}
		for i, a := range addrs {
			if a != eps[i].Addr {
				t.Fatalf("ParseEndpoints[%d] = %q, ParseEndpointsFile's %q", i, a, eps[i].Addr)
			}
		}
		if err != nil {
			return
		}
		var b strings.Builder
		for _, e := range eps {
			b.WriteString(e.Addr + " " + e.Role.String() + "\n")
		}
		again, warnings, err := ParseEndpointsFile([]byte(b.String()))
		if err != nil || len(warnings) != 0 || !slices.Equal(again, eps) {
			t.Fatalf("%v parse again to %v, %q, %v", eps, again, warnings, err)
		}
	})
}
