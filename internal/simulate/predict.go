package simulate

import (
	"fmt"
	"slices"
	"time"

	"github.com/laneway-dev/laneway/internal/workload"
	"github.com/laneway-dev/laneway/pkg/engine"
	"github.com/laneway-dev/laneway/pkg/policy"
)

// Prediction is the simulator's forecast of one weighted-share run.
type Prediction struct {
	// PremiumInFirst and RegularInFirst count each class among the first
	// perClass completions.
	PremiumInFirst, RegularInFirst int
	// RegularLeftAtPremiumDrain is how many regular requests had not
	// completed when the last premium one did.
	RegularLeftAtPremiumDrain int
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
	var pr Prediction
	spec := fmt.Sprintf("class=premium,arrival=once,count=%d,prompt=512,output=1;class=regular,arrival=once,count=%[1]d,prompt=512,output=1", perClass)
	t, err := Generate(spec, 1)
	if err != nil {
		return pr, err
	}
	cfg, err := policy.LoadYAML([]byte(workload.PolicyYAML(premiumQuantum, regularQuantum)))
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
	order := make([]int, len(res.Outcomes))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmpInt64(res.Outcomes[a].End, res.Outcomes[b].End) })
	premium, regular := 0, 0
	for n, i := range order {
		o := res.Outcomes[i]
		if o.Status != 200 {
			return pr, fmt.Errorf("request %d answered %d", i, o.Status)
		}
		if res.Classes[o.Class] == "premium" {
			premium++
			if n < perClass {
				pr.PremiumInFirst++
			}
			if premium == perClass {
				pr.RegularLeftAtPremiumDrain = perClass - regular
			}
		} else {
			regular++
			if n < perClass {
				pr.RegularInFirst++
			}
		}
		pr.Makespan = time.Duration(o.End - t.Requests[0].Arrival)
	}
	return pr, nil
}

// DemoEngine is the model server of `make demo` (SPEC §11's): 4
// sequences, max_num_batched_tokens 8192, no prefix caching, 40,000
// prefill tokens/s and 10 ms per output token, as internal/demo starts
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
