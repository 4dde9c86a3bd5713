package integration

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

// logLine is the part of a picker log line that log pipelines key on.
type logLine struct {
	Level string `json:"level"`
	V     *int   `json:"v"`
	Msg   string `json:"msg"`
}

// TestLogLevelNames: the picker's JSON log names its levels the way log
// pipelines read them, as Kubernetes components do: every Info line, at
// whatever verbosity, says "level":"info" and carries its verbosity as
// "v"; an error says "level":"error" and has no "v". (zap writes a logr
// V(2) line as "Level(-2)", which no pipeline reads as info.)
func TestLogLevelNames(t *testing.T) {
	bs := startBackends(t, 1)
	policyPath := writePolicy(t, busyPolicy)
	p := startEPP(t, launch.EPPOptions{Endpoints: addrs(bs), Policy: policyPath, Args: []string{"-v=3"}})
	// A rejected reload is an error line.
	replaceFile(t, policyPath, "policy_classes: [{name: broken, quantum: 0}]\n")

	cases := []struct {
		substr string // a line containing it
		level  string
		v      int // -1: no "v" field
	}{
		{substr: `"msg":"endpoint picker serving"`, level: "info", v: 0},
		{substr: `"msg":"policy class"`, level: "info", v: 2},
		{substr: `"msg":"policy file rejected`, level: "error", v: -1},
	}
	for _, tc := range cases {
		raw := p.WaitLog(t, tc.substr)
		var l logLine
		if err := json.Unmarshal([]byte(raw), &l); err != nil {
			t.Errorf("line %q is not JSON: %v", raw, err)
			continue
		}
		gotV := -1
		if l.V != nil {
			gotV = *l.V
		}
		if l.Level != tc.level || gotV != tc.v {
			t.Errorf("line %q: level %q v %d, want level %q v %d", raw, l.Level, gotV, tc.level, tc.v)
		}
	}
}

// TestGatewayLogLevelNames: the local gateway logs with the picker's level
// names too (its V(2) diagnostics were "Level(-2)" lines): a request it
// cannot ask the picker about, once the picker has stopped, is answered
// 500 and logged at "level":"info" with "v":2.
func TestGatewayLogLevelNames(t *testing.T) {
	bs := startBackends(t, 1)
	p := startEPP(t, launch.EPPOptions{Endpoints: addrs(bs)})
	g := bins.RunGateway(t, launch.GatewayOptions{EPP: p, Args: []string{"-v=2"}})
	if err := p.Stop(launch.DefaultStopGrace); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(g.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hi","max_tokens":1}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusInternalServerError {
		t.Errorf("status %d with the picker stopped, want 500", resp.StatusCode)
	}
	raw := g.WaitLog(t, `"msg":"ext_proc exchange failed"`)
	var l logLine
	if err := json.Unmarshal([]byte(raw), &l); err != nil {
		t.Fatalf("line %q is not JSON: %v", raw, err)
	}
	if l.Level != "info" || l.V == nil || *l.V != 2 {
		t.Errorf("line %q: want level \"info\" and v 2", raw)
	}
}
