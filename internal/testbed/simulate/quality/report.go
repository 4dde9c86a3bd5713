package quality

import (
	"fmt"
	"io"

	"github.com/laneway-dev/laneway/internal/testbed/simulate"
)

// WriteOverload prints the overload scenario's figures.
func WriteOverload(w io.Writer, f *OverloadFigures) {
	fmt.Fprintf(w, "overload: 8 servers, interactive + batch at %.1f req/s (2 × the %.1f req/s the fleet serves) for 10 simulated minutes\n", f.OfferedRate, f.SaturatedRate)
	fmt.Fprintf(w, "  interactive TTFT p99   laneway %8.0f ms   none %8.0f ms   ratio %.3f (target <= 0.333)\n", f.InteractiveTTFTP99, f.NoneInteractiveTTFTP99, f.TTFTRatio)
	fmt.Fprintf(w, "  output tokens/s        laneway %8.0f      none %8.0f      apart %+.2f%% (target within 3%%)\n", f.OutputTokensPerS, f.NoneOutputTokensPerS, -100*f.ThroughputLoss)
	fmt.Fprintf(w, "  batch token share while backlogged %.1f%% over %.0f s (queued %.0f%% of it), quantum share %.1f%% (target >=)\n",
		100*f.BatchShare, f.BacklogS, 100*f.Coverage, 100*f.BatchQuantumShare)
	for _, p := range []struct {
		name string
		c    []ClassRow
	}{{"laneway", rows(f.Policy.Classes)}, {"none", rows(f.None.Classes)}} {
		for _, c := range p.c {
			fmt.Fprintf(w, "  %-8s %-12s TTFT p50 %8.0f  p99 %8.0f ms   queue wait p99 %8.0f ms   %6.0f out tok/s\n", p.name, c.Class, c.P50, c.P99, c.WaitP99, c.TokS)
		}
	}
}

// ClassRow is one class line of a report.
type ClassRow struct {
	Class                   string
	P50, P99, WaitP99, TokS float64
}

func rows(cs []simulate.ClassSummary) []ClassRow {
	var out []ClassRow
	for _, c := range cs {
		out = append(out, ClassRow{c.Class, c.TTFT.P50, c.TTFT.P99, c.QueueWait.P99, c.OutputTokensPerSec})
	}
	return out
}

// WriteScale prints the scale scenario's figures.
func WriteScale(w io.Writer, f *ScaleFigures) {
	fmt.Fprintf(w, "scale: %d requests on %d servers (%.0f simulated s): %.1f s wall in all (target < 60 s), simulation %.1f s = %.0f requests/s, core %.0f ns per decision (%d decisions)\n",
		f.Requests, f.Servers, f.SimulatedS, f.WallS, f.RunS, f.RequestsPerS, f.CoreNsPerDecision, f.Decisions)
}

// WriteTenants prints the tenants scenario's figures.
func WriteTenants(w io.Writer, f *TenantsFigures) {
	fmt.Fprintf(w, "tenants: 50 tenants in one class, 2 flooding: quiet tenants' TTFT p99 %.0f ms with tenant_fairness, %.0f ms without, ratio %.3f (target <= 0.333)\n",
		f.QuietTTFTP99Fair, f.QuietTTFTP99Unfair, f.Ratio)
}

// WriteTwoWay prints the two-way comparison.
func WriteTwoWay(w io.Writer, f *TwoWayFigures) {
	fmt.Fprintf(w, "both ways: %d servers, %d requests (%s)\n", twoWayServers, f.Requests, f.Spec)
	fmt.Fprintf(w, "  %-12s %-22s %-22s %s\n", "class", "TTFT p50 real / sim", "TTFT p99 real / sim", fmt.Sprintf("first %d real / sim", f.N))
	for _, c := range f.Classes {
		fmt.Fprintf(w, "  %-12s %8.0f / %-8.0f ms  %8.0f / %-8.0f ms  %5d / %d\n", c.Class, c.RealP50, c.SimP50, c.RealP99, c.SimP99, c.RealFirstN, c.SimFirstN)
	}
	fmt.Fprintf(w, "  makespan real %.1f s, simulated %.1f s; output real %.0f tokens/s, simulated %.0f (%+.1f%%)\n",
		f.RealMakespanS, f.SimMakespanS, f.RealOutputTokensPerS, f.SimOutputTokensPerS, 100*f.ThroughputMiss())
}

// WriteDynamics prints the auto threshold's settle times.
func WriteDynamics(w io.Writer, f *DynamicsFigures) {
	for _, r := range []DynamicsRun{f.LoadStep, f.EngineChange} {
		fmt.Fprintf(w, "auto threshold, %s:\n", r.Name)
		for i, c := range r.Changes {
			fmt.Fprintf(w, "  change at %s: %d tokens before, settled after %.1f s\n", c, r.Levels[i], r.Settle[i].Seconds())
		}
		fmt.Fprintf(w, "  at the end of the run: %d tokens\n", r.Levels[len(r.Levels)-1])
	}
}
