package workload

import (
	"strings"
	"testing"
)

// result builds a two-class result from a pattern repeated until each class
// has perClass completions ('P' premium, 'R' regular).
func result(pattern string, perClass int) *Result {
	r := &Result{Spec: Spec{Classes: []string{"premium", "regular"}, PerClass: perClass}}
	counts := map[byte]int{}
	for len(r.Completions) < 2*perClass {
		for i := 0; i < len(pattern); i++ {
			c := pattern[i]
			if counts[c] == perClass {
				continue
			}
			counts[c]++
			class := "premium"
			if c == 'R' {
				class = "regular"
			}
			r.Completions = append(r.Completions, Completion{Class: class, Status: 200})
		}
	}
	return r
}

func TestAnalyze(t *testing.T) {
	tests := []struct {
		name     string
		pattern  string
		weighted bool
		want     Shares
		misses   int
	}{
		{
			name: "ideal 4:1", pattern: "PPPPR", weighted: true,
			want: Shares{First: "premium", Second: "regular", Prefix: 320, FirstInPrefix: 256, SecondInPrefix: 64,
				SecondLeftAtFirstDrain: 241, SecondAtFirst80: 19, SecondGain80To240: 40, OK: 640},
		},
		{
			name: "equal share", pattern: "PR", weighted: false,
			want: Shares{First: "premium", Second: "regular", Prefix: 320, FirstInPrefix: 160, SecondInPrefix: 160,
				SecondLeftAtFirstDrain: 1, SecondAtFirst80: 79, SecondGain80To240: 160, OK: 640},
		},
		{name: "equal share judged as weighted", pattern: "PR", weighted: true, misses: 2,
			want: Shares{First: "premium", Second: "regular", Prefix: 320, FirstInPrefix: 160, SecondInPrefix: 160,
				SecondLeftAtFirstDrain: 1, SecondAtFirst80: 79, SecondGain80To240: 160, OK: 640}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Analyze(result(tc.pattern, 320))
			if got != tc.want {
				t.Fatalf("Analyze = %+v\nwant      %+v", got, tc.want)
			}
			if m := got.Check(tc.weighted); len(m) != tc.misses {
				t.Fatalf("Check misses = %d (%s), want %d", len(m), strings.Join(m, "; "), tc.misses)
			}
		})
	}
}

func TestPromptBodiesAreDistinctAndExact(t *testing.T) {
	a := string(promptBody("m", 0, 0, 4))
	b := string(promptBody("m", 0, 1, 4))
	if a == b {
		t.Fatal("two requests share a prompt")
	}
	want := `{"model":"m","max_tokens":1,"stream":true,"prompt":[1000000,1000001,1000002,1000003]}`
	if a != want {
		t.Fatalf("body = %s, want %s", a, want)
	}
}
