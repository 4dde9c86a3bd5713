package quality

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/internal/testbed/replay"
	"github.com/laneway-dev/laneway/internal/testbed/simulate"
	"github.com/laneway-dev/laneway/pkg/engine"
)

// The two-way scenario: one multi-server overload run through real
// processes (modelsim servers, the picker, the local gateway) and through
// the simulator, compared per class. Small enough for a 2-core machine
// shared with other work: 4 servers of 8 sequences at 5,000 prefill
// tokens/s, offered twice what they serve for 20 s.
const (
	twoWayServers  = 4
	twoWayDuration = 20 * time.Second
	twoWayInter    = "prompt=100-300,output=~16"
	twoWayBatch    = "prompt=1500-2500,output=~32"
)

// twoWayEngine is the servers' engine, as modelsim flags and as the
// simulator's model.
func twoWayEngine() engine.Config {
	c := engine.DefaultConfig()
	c.MaxNumSeqs = 8
	c.PrefillTokensPerSec = 5000
	c.TimePerOutputToken = 10 * time.Millisecond
	c.EnablePrefixCaching = false
	return c
}

// ClassComparison is one class's figures both ways.
type ClassComparison struct {
	Class string
	// TTFT percentiles in ms, measured (real) and simulated.
	RealP50, RealP99, SimP50, SimP99 float64
	// FirstN: the class's requests among the first N completions.
	RealFirstN, SimFirstN int
	RealOK, SimOK         int
}

// TwoWayFigures are the two-way scenario's results.
type TwoWayFigures struct {
	Spec                        string
	Requests, N                 int
	RealMakespanS, SimMakespanS float64
	// Output tokens per second both ways: the completed requests' output
	// tokens over the makespan.
	RealOutputTokensPerS, SimOutputTokensPerS float64
	Classes                                   []ClassComparison
}

// MaxAutoThroughputMiss is how far the auto threshold's throughput
// through the real processes may lie from its simulation (issue 26).
const MaxAutoThroughputMiss = 0.05

// ThroughputMiss is the real run's output tokens/s relative to the
// simulated one's, less 1.
func (f *TwoWayFigures) ThroughputMiss() float64 {
	return f.RealOutputTokensPerS/f.SimOutputTokensPerS - 1
}

// AutoTwoClassPolicy is TwoClassPolicy with the default busy threshold,
// auto, in place of one step budget.
const AutoTwoClassPolicy = `# The scheduling-quality benchmark's policy with prefill_busy_threshold auto.
policy_classes:
  - name: interactive
    queue_policy: fcfs
    quantum: 3000
  - name: batch
    queue_policy: fcfs
    quantum: 1000
default_policy_class: batch
`

// Agreement lists where the two ways disagree beyond issue 16's bands for
// a quiet machine: TTFT p50 within 20%, first-N shares within ±5%.
func (f *TwoWayFigures) Agreement() []string {
	var m []string
	for _, c := range f.Classes {
		if d := c.RealP50/c.SimP50 - 1; d > 0.2 || d < -0.2 {
			m = append(m, fmt.Sprintf("%s TTFT p50: real %.0f ms, simulated %.0f ms (%+.0f%%)", c.Class, c.RealP50, c.SimP50, 100*d))
		}
		if f.N > 0 {
			if d := float64(c.RealFirstN-c.SimFirstN) / float64(f.N); d > 0.05 || d < -0.05 {
				m = append(m, fmt.Sprintf("%s first-%d share: real %d, simulated %d (%+.1f points)", c.Class, f.N, c.RealFirstN, c.SimFirstN, 100*d))
			}
		}
	}
	return m
}

// RunTwoWay runs the scenario with the binaries in binDir (modelsim, epp,
// gateway), writing the processes' logs and the simulator's outputs to
// dir.
func RunTwoWay(ctx context.Context, binDir, dir string) (*TwoWayFigures, error) {
	return RunTwoWayPolicy(ctx, binDir, dir, TwoClassPolicy)
}

// RunTwoWayPolicy is RunTwoWay with another policy (YAML text) over the
// same two classes.
func RunTwoWayPolicy(ctx context.Context, binDir, dir, policyYAML string) (*TwoWayFigures, error) {
	ec := twoWayEngine()
	capSpec := fmt.Sprintf("class=interactive,arrival=once,count=1600,%s;class=batch,arrival=once,count=400,%s", twoWayInter, twoWayBatch)
	res, sum, err := runSpec(capSpec, twoWayServers, ec, []string{simulate.BaselineNone}, "")
	if err != nil {
		return nil, err
	}
	offered := 2 * float64(len(res[0].Outcomes)) / sum.Policies[0].MakespanS
	spec := fmt.Sprintf("class=interactive,rate=%.2f,%s,duration=%s;class=batch,rate=%.2f,%s,duration=%[3]s",
		0.8*offered, twoWayInter, twoWayDuration, 0.2*offered, twoWayBatch)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	pol := filepath.Join(dir, "laneway.yaml")
	if err := os.WriteFile(pol, []byte(policyYAML), 0o644); err != nil {
		return nil, err
	}

	// Simulated: the picker as the epp runs it (prefix picker, scraping
	// every 100 ms).
	c := simulate.DefaultConfig()
	c.Generate, c.Servers, c.Engine, c.Policies = spec, twoWayServers, ec, []string{pol}
	c.ScrapeInterval = 100 * time.Millisecond
	setup, err := c.Load()
	if err != nil {
		return nil, err
	}
	results, simSum, err := simulate.RunAll(setup, c.Options(), nil)
	if err != nil {
		return nil, err
	}
	simDir := filepath.Join(dir, "simulated")
	if err := os.MkdirAll(simDir, 0o755); err != nil {
		return nil, err
	}
	if err := simulate.WriteOutputs(simDir, setup.Trace, results, simSum); err != nil {
		return nil, err
	}

	// Measured.
	real, err := runReal(ctx, binDir, dir, setup.Trace, ec, pol)
	if err != nil {
		return nil, err
	}

	f := &TwoWayFigures{Spec: spec, Requests: len(setup.Trace.Requests), SimMakespanS: simSum.Policies[0].MakespanS}
	sim := results[0]
	simEnds := make([]int64, len(sim.Outcomes))
	simOK := make([]bool, len(sim.Outcomes))
	for i, o := range sim.Outcomes {
		simEnds[i], simOK[i] = o.End, o.Status == 200
	}
	realEnds := make([]int64, len(real))
	realOK := make([]bool, len(real))
	var realLast int64
	for i, r := range real {
		realEnds[i], realOK[i] = r.end, r.status == 200
		realLast = max(realLast, r.end)
	}
	f.RealMakespanS = float64(realLast) / 1e9
	var realOut, simOut int64
	for i, q := range setup.Trace.Requests {
		if realOK[i] {
			realOut += int64(q.OutputTokens)
		}
		if simOK[i] {
			simOut += int64(q.OutputTokens)
		}
	}
	f.RealOutputTokensPerS, f.SimOutputTokensPerS = float64(realOut)/f.RealMakespanS, float64(simOut)/f.SimMakespanS
	n := min(count(simOK), count(realOK)) / 2
	f.N = n
	simFirst, realFirst := firstN(simEnds, simOK, n), firstN(realEnds, realOK, n)
	for _, name := range []string{"interactive", "batch"} {
		cc := ClassComparison{Class: name}
		var rt, st []float64
		for i, q := range setup.Trace.Requests {
			if q.Class != name {
				continue
			}
			if simOK[i] {
				cc.SimOK++
				st = append(st, float64(sim.Outcomes[i].First-q.Arrival)/1e6)
				if simFirst[i] {
					cc.SimFirstN++
				}
			}
			if realOK[i] {
				cc.RealOK++
				rt = append(rt, float64(real[i].first-q.Arrival)/1e6)
				if realFirst[i] {
					cc.RealFirstN++
				}
			}
		}
		cc.RealP50, cc.RealP99 = pct(rt, 50), pct(rt, 99)
		cc.SimP50, cc.SimP99 = pct(st, 50), pct(st, 99)
		f.Classes = append(f.Classes, cc)
	}
	return f, nil
}

func count(ok []bool) int {
	n := 0
	for _, v := range ok {
		if v {
			n++
		}
	}
	return n
}

// firstN marks the requests among the first n completions.
func firstN(ends []int64, ok []bool, n int) []bool {
	var idx []int
	for i := range ends {
		if ok[i] {
			idx = append(idx, i)
		}
	}
	slices.SortStableFunc(idx, func(a, b int) int { return int(ends[a] - ends[b]) })
	out := make([]bool, len(ends))
	for _, i := range idx[:min(n, len(idx))] {
		out[i] = true
	}
	return out
}

func pct(v []float64, p int) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return v[max(0, (len(v)*p+99)/100-1)]
}

// realOutcome is one request as the load client saw it: times from the
// run's start, nanoseconds.
type realOutcome struct {
	status     int
	first, end int64
}

// runReal starts the fleet through internal/testbed/launch (the launcher of the
// suites and the demo), replays the trace open loop through the gateway,
// and stops everything, leaving each process's log in dir.
func runReal(ctx context.Context, binDir, dir string, t *simulate.Trace, ec engine.Config, policyFile string) (_ []realOutcome, err error) {
	fl, err := simulate.NewFleet(twoWayServers, ec)
	if err != nil {
		return nil, err
	}
	f, err := replay.StartFleet(ctx, replay.FleetOptions{Bins: launch.InDir(binDir), Fleet: fl, Host: "127.0.0.2",
		Policy: policyFile, LogDir: dir})
	if err != nil {
		return nil, err
	}
	defer func() {
		if serr := f.Stop(); serr != nil && err == nil {
			err = serr
		}
	}()
	return sendTrace(ctx, f.URL+"/v1/completions", t)
}

// replay sends the trace open loop: each request at its arrival time
// (measured from the start, whether or not earlier ones have finished),
// streaming, with a token-id prompt of exactly its length, distinct from
// every other. It returns what each request saw.
func sendTrace(ctx context.Context, url string, t *simulate.Trace) ([]realOutcome, error) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4096, DisableCompression: true}, Timeout: 10 * time.Minute}
	bodies := make([][]byte, len(t.Requests))
	order := make([]int, len(t.Requests))
	for i, q := range t.Requests {
		var b bytes.Buffer
		fmt.Fprintf(&b, `{"model":"sim-model","stream":true,"max_tokens":%d,"prompt":[`, q.OutputTokens)
		for j := range q.PromptTokens {
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(1_000_000 + i*8192 + j))
		}
		b.WriteString("]}")
		bodies[i] = b.Bytes()
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return int(t.Requests[a].Arrival - t.Requests[b].Arrival) })
	out := make([]realOutcome, len(t.Requests))
	var wg sync.WaitGroup
	begin := time.Now()
	for _, i := range order {
		if d := time.Duration(t.Requests[i].Arrival) - time.Since(begin); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		wg.Go(func() { out[i] = send(ctx, client, url, t.Requests[i].Class, bodies[i], begin) })
	}
	wg.Wait()
	for _, o := range out {
		if o.status == 0 {
			return out, errors.New("a request failed at the transport (see the logs)")
		}
	}
	return out, nil
}

func send(ctx context.Context, client *http.Client, url, class string, body []byte, begin time.Time) realOutcome {
	o := realOutcome{first: -1, end: -1}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return o
	}
	req.Header.Set("content-type", "application/json")
	req.Header.Set("x-dynamo-meta-policy-class", class)
	resp, err := client.Do(req)
	if err != nil {
		return o
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		o.status = resp.StatusCode
		return o
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			o.end = int64(time.Since(begin))
			o.status = http.StatusOK
			break
		}
		if o.first < 0 {
			o.first = int64(time.Since(begin))
		}
	}
	return o
}
