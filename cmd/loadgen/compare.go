package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/laneway-dev/laneway/internal/testbed/load"
)

// compare spawns the references the flags ask for (the upstream lwepp of
// SPEC §13, the transport floor) next to the spawned Laneway (lane) and,
// for every run of the mode (one open loop, or each closed-loop level),
// measures Laneway, each reference, then Laneway again: alternating keeps
// the machine's drift from favouring either side.
func compare(ctx context.Context, f *flags, lane *picker, cfg load.Config, levels []int) error {
	if !f.spawn || spawnedEndpoint == "" {
		return errors.New("--compare-lwepp, --compare-floor and --compare-tickets need --spawn (the references route to the spawned idle endpoint)")
	}
	var refs []*picker
	for _, want := range []struct {
		on    bool
		spawn func(context.Context, *flags) (*picker, func(), error)
	}{{tk.compare, func(ctx context.Context, f *flags) (*picker, func(), error) {
		return spawnFollower(ctx, f, lane.r.PickerCPU)
	}},
		{lw.compare, spawnLWEPP}, {f.floor, spawnFloor}} {
		if !want.on {
			continue
		}
		ref, stop, err := want.spawn(ctx, f)
		if err != nil {
			return err
		}
		defer stop()
		refs = append(refs, ref)
	}

	first, second := *lane, *lane
	first.label, second.label = "laneway (run 1 of 2)", "laneway (run 2 of 2)"
	sides := append(append([]*picker{&first}, refs...), &second)
	for _, c := range runConfigs(f, cfg, levels) {
		res := make([]load.Result, len(sides))
		var fs followerSide
		for i, p := range sides {
			var err error
			if p.follower != nil {
				res[i], fs, err = runFollower(ctx, f, p, c)
			} else {
				res[i], err = p.run(ctx, f, c)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", p.label, err)
			}
			if err := report(f, p, &res[i]); err != nil {
				return err
			}
		}
		if !f.jsonOut {
			fmt.Println(compareLine(sides, res, fs))
		}
	}
	return nil
}

// compareLine sums up one alternation on a line: Laneway's two runs, each
// reference, and how far Laneway's p50 and p99 (the mean of its runs) sit
// above the floor when it ran.
func compareLine(sides []*picker, res []load.Result, fs followerSide) string {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.3f", float64(d)/float64(time.Millisecond)) }
	cpu := func(r *load.Result) string {
		if !r.HasPickerCPU {
			return "n/a"
		}
		return fmt.Sprintf("%.4f", r.PickerCPUPer1000)
	}
	a, c := &res[0], &res[len(res)-1]
	var b strings.Builder
	fmt.Fprintf(&b, "COMPARE  laneway p50 %s/%s p99 %s/%s max %s/%s ms, CPU %s/%s s per 1,000",
		ms(a.Latency.P50), ms(c.Latency.P50), ms(a.Latency.P99), ms(c.Latency.P99), ms(a.Latency.Max), ms(c.Latency.Max), cpu(a), cpu(c))
	errs := []string{fmt.Sprint(a.Errors)}
	for i := 1; i < len(res)-1; i++ {
		r := &res[i]
		fmt.Fprintf(&b, "  |  %s p50 %s p99 %s max %s ms, CPU %s s per 1,000",
			sides[i].name, ms(r.Latency.P50), ms(r.Latency.P99), ms(r.Latency.Max), cpu(r))
		if sides[i].name == ticketsName {
			fmt.Fprintf(&b, ", follower CPU %.4f s per 1,000 (%v decisions not tickets)", fs.cpuPer1000, fs.notTickets)
			if a.HasPickerCPU && c.HasPickerCPU && r.HasPickerCPU {
				fmt.Fprintf(&b, "  |  picker CPU per ticket / per local decision: %.3f", r.PickerCPUPer1000/((a.PickerCPUPer1000+c.PickerCPUPer1000)/2))
			}
		}
		if sides[i].name == floorName {
			fmt.Fprintf(&b, "  |  laneway above the floor: p50 %+.3f p99 %+.3f ms",
				ms64((a.Latency.P50+c.Latency.P50)/2-r.Latency.P50), ms64((a.Latency.P99+c.Latency.P99)/2-r.Latency.P99))
		}
		errs = append(errs, fmt.Sprint(r.Errors))
	}
	errs = append(errs, fmt.Sprint(c.Errors))
	fmt.Fprintf(&b, "  (errors %s)\n", strings.Join(errs, "/"))
	return b.String()
}

func ms64(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
