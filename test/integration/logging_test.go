package integration

import (
	"encoding/json"
	"testing"

	"github.com/laneway-dev/laneway/internal/launch"
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
	p := startEPP(t, launch.PickerOptions{Endpoints: addrs(bs), Policy: policyPath, Args: []string{"-v=3"}})
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
