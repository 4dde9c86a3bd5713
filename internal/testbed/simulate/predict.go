package simulate

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/laneway-dev/laneway/internal/testbed/workload"
	"github.com/laneway-dev/laneway/pkg/engine"
	"github.com/laneway-dev/laneway/pkg/policy"
)

// Prediction is the simulator's forecast of one weighted-share run: the
// shares as workload.Analyze computes them from the real run (premium
// First, regular Second), and the makespan.
type Prediction struct {
	workload.Shares
	// Makespan is release to last completion.
	Makespan time.Duration
}

// PredictWeightedShare simulates `make demo`'s run for the given quanta:
// SPEC §11's workload (perClass + perClass distinct 512-token prompts of
// one output token, released together, interleaved) through the real core
// with workload.PolicyYAML's policy, on the demo's one model server (4
// sequences, max_num_batched_tokens 8192, no prefix caching, 40,000
// prefill tokens/s, 10 ms per output token).
func PredictWeightedShare(premiumQuantum, regularQuantum uint64, perClass int) (Prediction, error) {
	return PredictWeightedShareThreshold(premiumQuantum, regularQuantum, perClass, "1536")
}

// PredictWeightedShareThreshold is PredictWeightedShare with the policy's
// prefill_busy_threshold set to threshold (workload.PolicyYAMLThreshold):
// a policy with auto is scraped at the picker's default interval.
func PredictWeightedShareThreshold(premiumQuantum, regularQuantum uint64, perClass int, threshold string) (Prediction, error) {
	var pr Prediction
	spec := fmt.Sprintf("class=premium,arrival=once,count=%d,prompt=512,output=1;class=regular,arrival=once,count=%[1]d,prompt=512,output=1", perClass)
	t, err := Generate(spec, 1)
	if err != nil {
		return pr, err
	}
	cfg, err := policy.LoadYAML([]byte(workload.PolicyYAMLThreshold(premiumQuantum, regularQuantum, threshold)))
	if err != nil {
		return pr, err
	}
	p, err := NewPolicy(fmt.Sprintf("%d:%d", premiumQuantum, regularQuantum), cfg, PickerPrefix)
	if err != nil {
		return pr, err
	}
	f, err := NewFleet(1, DemoEngine())
	if err != nil {
		return pr, err
	}
	res, err := Run(t, f, p, Options{Seed: 1})
	if err != nil {
		return pr, err
	}
	// The completions in the order they finished, as the real run
	// records them, judged by the same Analyze.
	run := workload.Result{Spec: workload.Spec{Classes: []string{"premium", "regular"}, PerClass: perClass}}
	for i := range res.Outcomes {
		o := &res.Outcomes[i]
		if o.Status != 200 {
			return pr, fmt.Errorf("request %d answered %d", i, o.Status)
		}
		run.Completions = append(run.Completions, workload.Completion{Class: res.Classes[o.Class], Status: 200,
			At: time.Duration(o.End - t.Requests[0].Arrival)})
	}
	slices.SortStableFunc(run.Completions, func(a, b workload.Completion) int { return cmp.Compare(a.At, b.At) })
	pr.Shares = workload.Analyze(&run)
	pr.Makespan = run.Completions[len(run.Completions)-1].At
	return pr, nil
}

// DemoEngine is the model server of `make demo` (SPEC §11's): 4
// sequences, max_num_batched_tokens 8192, no prefix caching, 40,000
// prefill tokens/s and 10 ms per output token, as internal/testbed/demo starts
// modelsim.
func DemoEngine() engine.Config {
	c := engine.DefaultConfig()
	c.MaxNumSeqs = 4
	c.MaxNumBatchedTokens = 8192
	c.EnablePrefixCaching = false
	c.PrefillTokensPerSec = 40000
	c.TimePerOutputToken = 10 * time.Millisecond
	return c
}
