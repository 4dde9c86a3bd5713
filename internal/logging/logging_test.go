package logging

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/go-logr/logr"
)

// TestNewLevels: every Info line says level info with its verbosity
// as v, through derived loggers too; lines above -v are not written;
// errors say level error without v or a stack trace.
func TestNewLevels(t *testing.T) {
	cases := []struct {
		name  string
		log   func(logr.Logger)
		want  map[string]any // nil: no line
		noKey []string
	}{
		{name: "info", log: func(l logr.Logger) { l.Info("m") }, want: map[string]any{"level": "info", "v": 0.0}},
		{name: "V(2)", log: func(l logr.Logger) { l.V(2).Info("m") }, want: map[string]any{"level": "info", "v": 2.0}},
		{name: "derived V(3)", log: func(l logr.Logger) { l.WithName("x").WithValues("k", 1).V(3).Info("m") },
			want: map[string]any{"level": "info", "v": 3.0, "k": 1.0, "logger": "x"}},
		{name: "above -v", log: func(l logr.Logger) { l.V(4).Info("m") }},
		{name: "error", log: func(l logr.Logger) { l.Error(errors.New("boom"), "m") },
			want: map[string]any{"level": "error", "error": "boom"}, noKey: []string{"v", "stacktrace"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			tc.log(New(3, &buf))
			if tc.want == nil {
				if buf.Len() != 0 {
					t.Fatalf("wrote %q, want nothing", buf.String())
				}
				return
			}
			var got map[string]any
			if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
				t.Fatalf("line %q: %v", buf.String(), err)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s = %v, want %v (line %s)", k, got[k], v, buf.String())
				}
			}
			for _, k := range tc.noKey {
				if _, ok := got[k]; ok {
					t.Errorf("line has %s: %s", k, buf.String())
				}
			}
		})
	}
}
