package status

import (
	"fmt"
	"io"
	"strings"
)

// Render writes the page as tables that fit an 80-column terminal: one per
// class (its queue, its last minute, its busiest tenants), then the
// endpoints.
func Render(w io.Writer, p *Page) {
	fmt.Fprintf(w, "%s  window %ds  queued %d\n", p.Time.Format("2006-01-02 15:04:05Z"), p.WindowSeconds, p.Queued)
	fmt.Fprintln(w, clip(p.Identity, 80))
	for i := range p.Classes {
		c := &p.Classes[i]
		fmt.Fprintln(w)
		jain := "-"
		if c.JainIndex != nil {
			jain = fmt.Sprintf("%.3f/%d", *c.JainIndex, c.BackloggedTenants)
		}
		fmt.Fprintf(w, "class %s\n", clip(c.Name, 74))
		fmt.Fprintf(w, "  pending %d (%s tokens, %s cached)  deficit %s  tenants %d\n",
			c.Pending, human(c.PendingRawISLTokens), human(c.PendingCachedTokens), human(c.Deficit), c.TenantsActive)
		fmt.Fprintf(w, "  last %ds: %d sent, %d refused, wait p50 %s p99 %s, jain %s\n",
			p.WindowSeconds, c.Dispatched, c.Rejected, seconds(c.QueueWaitP50Seconds), seconds(c.QueueWaitP99Seconds), jain)
		if len(c.TopQueued) == 0 && len(c.TopServed) == 0 {
			continue
		}
		fmt.Fprintf(w, "  %-20s %6s %8s   %-20s %8s\n", "queued by tenant", "reqs", "tokens", "served, last minute", "tokens")
		for j := 0; j < max(len(c.TopQueued), len(c.TopServed)); j++ {
			left, right := fmt.Sprintf("%-20s %6s %8s", "", "", ""), ""
			if j < len(c.TopQueued) {
				q := c.TopQueued[j]
				left = fmt.Sprintf("%-20s %6d %8s", clip(q.Tenant, 20), q.Pending, human(q.PendingRawISLTokens))
			}
			if j < len(c.TopServed) {
				s := c.TopServed[j]
				right = fmt.Sprintf("%-20s %8s", clip(s.Tenant, 20), human(s.UncachedTokens))
			}
			fmt.Fprintln(w, strings.TrimRight("  "+left+"   "+right, " "))
		}
	}
	fmt.Fprintln(w)
	// 80 columns: an IPv4 address with its port fits the first 21.
	fmt.Fprintf(w, "%-21s %6s %8s %-10s %4s %6s %5s %6s %6s\n", "endpoint", "prefill", "inflight", "state", "wait", "unseen", "await", "rate/s", "thresh")
	for _, e := range p.Endpoints {
		state := "ok"
		switch {
		case e.Stale:
			state = "stale"
		case e.Tainted && e.Busy:
			state = "taint,busy"
		case e.Tainted:
			state = "tainted"
		case e.Busy:
			state = "busy"
		}
		// The threshold column is the auto threshold in force ("-" when
		// no class has one: the classes' own thresholds are in the policy).
		threshold := "-"
		if e.AutoThreshold > 0 {
			threshold = human(e.AutoThreshold)
		}
		fmt.Fprintf(w, "%-21s %6s %8d %-10s %4d %6d %5d %6s %6s\n", clip(e.Addr, 21), human(e.ActivePrefillTokens), e.InFlight, state,
			e.EngineWaiting, e.UnseenWaiting, e.AwaitingEngine, human(uint64(e.PrefillRate)), threshold)
	}
}

// human prints a token count short: 950, 12.3k, 4.56M.
func human(n uint64) string {
	switch {
	case n >= 10_000_000_000:
		return fmt.Sprintf("%.0fG", float64(n)/1e9)
	case n >= 1_000_000_000:
		return fmt.Sprintf("%.2fG", float64(n)/1e9)
	case n >= 10_000_000:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 1_000_000:
		return fmt.Sprintf("%.2fM", float64(n)/1e6)
	case n >= 10_000:
		return fmt.Sprintf("%.1fk", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}

func seconds(s float64) string {
	switch {
	case s == 0:
		return "-"
	case s < 1:
		return fmt.Sprintf("%.0fms", s*1000)
	}
	return fmt.Sprintf("%.1fs", s)
}

// clip shortens s to n runes, marking the cut.
func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
