package simulate

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
)

// WriteRequests writes requests.jsonl: one line per request in trace
// order, {"id", "class", "tenant", "arrival_ms", "dispatch_ms",
// "first_token_ms", "end_ms", "status", "server", "cached_tokens"}, times
// in virtual milliseconds (null when never reached), server the index of
// the server that served it and cached_tokens its engine's prefix-cache
// hit (null for none; for a disaggregated request, the prefill server's),
// and for a disaggregated request "prefill_server", the server that
// prefilled it.
func WriteRequests(w io.Writer, t *Trace, res *Result) error {
	bw := bufio.NewWriterSize(w, 1<<16)
	quoted := map[string][]byte{}
	quote := func(s string) []byte {
		if b, ok := quoted[s]; ok {
			return b
		}
		b, _ := json.Marshal(s)
		quoted[s] = b
		return b
	}
	ms := func(b []byte, ns int64) []byte {
		if ns < 0 {
			return append(b, "null"...)
		}
		return strconv.AppendFloat(b, float64(ns)/1e6, 'f', -1, 64)
	}
	var b []byte
	for i := range res.Outcomes {
		o := &res.Outcomes[i]
		q := &t.Requests[i]
		b = append(b[:0], `{"id":`...)
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, `,"class":`...)
		b = append(b, quote(res.Classes[o.Class])...)
		b = append(b, `,"tenant":`...)
		b = append(b, quote(q.Tenant)...)
		b = append(b, `,"arrival_ms":`...)
		b = ms(b, q.Arrival)
		b = append(b, `,"dispatch_ms":`...)
		dispatch := int64(-1)
		if o.Server >= 0 {
			dispatch = o.Leave
		}
		b = ms(b, dispatch)
		b = append(b, `,"first_token_ms":`...)
		b = ms(b, o.First)
		b = append(b, `,"end_ms":`...)
		b = ms(b, o.End)
		b = append(b, `,"status":`...)
		b = strconv.AppendInt(b, int64(o.Status), 10)
		b = append(b, `,"server":`...)
		if o.Server >= 0 {
			b = strconv.AppendInt(b, int64(o.Server), 10)
		} else {
			b = append(b, "null"...)
		}
		b = append(b, `,"cached_tokens":`...)
		if o.Server >= 0 && o.Status == 200 {
			b = strconv.AppendUint(b, uint64(o.EngineCached), 10)
		} else {
			b = append(b, "null"...)
		}
		if o.Prefill >= 0 {
			b = append(b, `,"prefill_server":`...)
			b = strconv.AppendInt(b, int64(o.Prefill), 10)
		}
		b = append(b, "}\n"...)
		if _, err := bw.Write(b); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// Summary is summary.json.
type Summary struct {
	Trace    TraceInfo       `json:"trace"`
	Fleet    FleetInfo       `json:"fleet"`
	Seed     uint64          `json:"seed"`
	Policies []PolicySummary `json:"policies"`
}

// TraceInfo describes the trace of a summary.
type TraceInfo struct {
	Source   string  `json:"source"`
	Requests int     `json:"requests"`
	SpanS    float64 `json:"span_s"`
	Tenants  bool    `json:"tenants"`
}

// FleetInfo describes the fleet of a summary: groups of identical
// servers, in server order.
type FleetInfo struct {
	Servers int          `json:"servers"`
	Groups  []FleetGroup `json:"groups"`
}

func fleetInfo(f *Fleet) FleetInfo {
	fi := FleetInfo{Servers: len(f.Servers)}
	for _, s := range f.Servers {
		g := groupOfServer(s)
		if n := len(fi.Groups); n > 0 {
			last := fi.Groups[n-1]
			last.Count = 1
			if last == g {
				fi.Groups[n-1].Count++
				continue
			}
		}
		fi.Groups = append(fi.Groups, g)
	}
	return fi
}

// WriteOutputs writes DIR/<policy>/requests.jsonl for every run and
// DIR/summary.json.
func WriteOutputs(dir string, t *Trace, results []*Result, s *Summary) error {
	for _, res := range results {
		pd := filepath.Join(dir, res.Policy.Name)
		if err := os.MkdirAll(pd, 0o755); err != nil {
			return fmt.Errorf("output: %w", err)
		}
		f, err := os.Create(filepath.Join(pd, "requests.jsonl"))
		if err != nil {
			return fmt.Errorf("output: %w", err)
		}
		werr := WriteRequests(f, t, res)
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return fmt.Errorf("output %s: %w", f.Name(), werr)
		}
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("output summary.json: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.json"), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("output: %w", err)
	}
	return nil
}

// WriteTable prints the summary table: per policy and class, requests,
// 429s, TTFT and queue-wait percentiles, output tokens/s, share of the
// uncached tokens served in the contended window, first-N completions and,
// with tenants, Jain's index between them.
func WriteTable(w io.Writer, s *Summary) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	tenants := s.Trace.Tenants
	head := "policy\tclass\trequests\t429\tTTFT p50/p90/p99 ms\tqueue wait p50/p90/p99 ms\tout tok/s\tuncached share\tfirst N\tITL p50/p99 ms\t"
	if tenants {
		head += "Jain (tenants)\t"
	}
	fmt.Fprintln(tw, head)
	pct := func(p Percentiles) string {
		return fmt.Sprintf("%s / %s / %s", short(p.P50), short(p.P90), short(p.P99))
	}
	for _, p := range s.Policies {
		rows := append(append([]ClassSummary(nil), p.Classes...), p.Total)
		for i, c := range rows {
			name := p.Policy
			if i > 0 {
				name = ""
			}
			line := fmt.Sprintf("%s\t%s\t%d\t%d\t%s\t%s\t%.0f\t%.1f%%\t%d/%d\t%s / %s\t", name, c.Class, c.Requests, c.Rejected429,
				pct(c.TTFT), pct(c.QueueWait), c.OutputTokensPerSec, 100*c.UncachedShare, c.FirstN, p.FirstN, short(c.ITL.P50), short(c.ITL.P99))
			if tenants {
				if c.JainTenants != nil {
					line += fmt.Sprintf("%.3f\t", *c.JainTenants)
				} else {
					line += "-\t"
				}
			}
			fmt.Fprintln(tw, line)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var sims []string
	for _, p := range s.Policies {
		sims = append(sims, fmt.Sprintf("%s %.2fs (%.0f req/s, core %.0f ns/decision)", p.Policy, p.Sim.WallS, p.Sim.RequestsPerS, p.Sim.CoreNsPerDecision))
	}
	_, err := fmt.Fprintf(w, "makespan %s; contended window %s; simulated in %s\n",
		joinPolicies(s, func(p PolicySummary) string { return fmt.Sprintf("%.1fs", p.MakespanS) }),
		joinPolicies(s, func(p PolicySummary) string { return fmt.Sprintf("%.1fs", p.WindowS) }),
		strings.Join(sims, ", "))
	if err != nil {
		return err
	}
	pd, lora := false, false
	for _, p := range s.Policies {
		pd = pd || p.Disaggregated > 0
		lora = lora || p.LoRALoads > 0
	}
	if pd {
		_, err = fmt.Fprintf(w, "disaggregated requests %s\n", joinPolicies(s, func(p PolicySummary) string { return strconv.Itoa(p.Disaggregated) }))
	}
	if lora && err == nil {
		_, err = fmt.Fprintf(w, "LoRA adapter loads %s\n", joinPolicies(s, func(p PolicySummary) string { return strconv.FormatUint(p.LoRALoads, 10) }))
	}
	return err
}

func joinPolicies(s *Summary, f func(PolicySummary) string) string {
	var parts []string
	for _, p := range s.Policies {
		parts = append(parts, p.Policy+" "+f(p))
	}
	return strings.Join(parts, ", ")
}

// short formats milliseconds with three significant digits.
func short(ms float64) string {
	switch {
	case ms >= 100:
		return strconv.FormatFloat(ms, 'f', 0, 64)
	case ms >= 10:
		return strconv.FormatFloat(ms, 'f', 1, 64)
	}
	return strconv.FormatFloat(ms, 'f', 2, 64)
}
