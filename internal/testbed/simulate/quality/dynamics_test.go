package quality

import (
	"testing"
	"time"
)

// TestDynamics: after a load step and after an engine change the auto
// threshold settles within MaxSettle, and lands where the change says it
// should: lower under the doubled load, lower for the halved step budget.
func TestDynamics(t *testing.T) {
	f, err := RunDynamics("")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range f.Misses() {
		t.Error(m)
	}
	for _, r := range []DynamicsRun{f.LoadStep, f.EngineChange} {
		t.Logf("%s: settled %v after the changes at %v; levels %v", r.Name, r.Settle, r.Changes, r.Levels)
		if len(r.Settle) != 2 || len(r.Levels) != 3 {
			t.Fatalf("%s: %d settle times, %d levels", r.Name, len(r.Settle), len(r.Levels))
		}
	}
	if l := f.LoadStep.Levels; l[1] >= l[0] {
		t.Errorf("load step: threshold %d under the doubled load, %d before it; want lower", l[1], l[0])
	}
	if l := f.EngineChange.Levels; l[1] > 4096 {
		t.Errorf("engine change: threshold %d with a 4096-token step budget, want at most the budget", l[1])
	}
	if MaxSettle != 5*time.Second {
		t.Fatalf("MaxSettle %v: issue 26 says 5 s", MaxSettle)
	}
}
