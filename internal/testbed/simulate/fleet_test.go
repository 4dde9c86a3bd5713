package simulate

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/pkg/engine"
)

// TestLoadFleet: a fleet file's groups take the flags' values for what
// they leave out, and summary.json describes the fleet in the same groups.
func TestLoadFleet(t *testing.T) {
	base := engine.DefaultConfig()
	path := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(path, []byte(`
servers:
  - count: 2
    max_num_seqs: 64
    scheduling_policy: null
  - {}
  - count: 3
    prefill_tokens_per_sec: 10000
    time_per_output_token: 30ms
    enable_prefix_caching: false
`), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := LoadFleet(path, base)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Servers) != 6 {
		t.Fatalf("%d servers, want 6", len(f.Servers))
	}
	if e := f.Servers[0].Engine; e.MaxNumSeqs != 64 || e.SchedulingPolicy != base.SchedulingPolicy || e.TimePerOutputToken != base.TimePerOutputToken {
		t.Errorf("group 1 engine %+v, want max_num_seqs 64 and the rest from the flags", e)
	}
	if e := f.Servers[5].Engine; e.PrefillTokensPerSec != 10000 || e.TimePerOutputToken != 30*time.Millisecond || e.EnablePrefixCaching || e.MaxNumSeqs != base.MaxNumSeqs {
		t.Errorf("group 3 engine %+v", e)
	}
	g := groupOf(base)
	g1, g2, g3 := g, g, g
	g1.Count, g1.MaxNumSeqs = 2, 64
	g3.Count, g3.PrefillTokensPerSec, g3.TimePerOutputToken, g3.EnablePrefixCaching = 3, 10000, "30ms", false
	if got, want := fleetInfo(f), (FleetInfo{Servers: 6, Groups: []FleetGroup{g1, g2, g3}}); !reflect.DeepEqual(got, want) {
		t.Errorf("summary fleet\n%+v\nwant\n%+v", got, want)
	}
}

func TestLoadFleetErrors(t *testing.T) {
	for _, tc := range []struct{ name, file, want string }{
		{"no servers", "servers: []", "no servers"},
		{"unknown key", "servers: [{count: 1, max_num_seq: 4}]", `unknown field "max_num_seq"`},
		{"unknown top-level key", "server: [{count: 1}]", `unknown field "server"`},
		{"bad duration", "servers: [{}, {time_per_output_token: fast}]", "group 2: time_per_output_token: time: invalid duration"},
		{"count 0", "servers: [{count: 0}]", "group 1: count 0: want >= 1"},
		{"invalid engine", "servers: [{max_num_seqs: 0}]", "group 1: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "fleet.yaml")
			if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := LoadFleet(path, engine.DefaultConfig())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
