package sched

import (
	"slices"

	"github.com/laneway-dev/laneway/pkg/podmetrics"
)

// This file holds LoRA adapter affinity (SPEC §5, LoRA adapters): what the
// core knows of each endpoint's adapters (scraped vllm:lora_requests_info,
// plus this picker's own requests in flight there) and the tier that
// reorders a pick for a request whose model names an adapter.

// LoRAOutcome is where an adapter request's pick stood (Grant.LoRA); its
// String is the laneway_lora_affinity_picks_total outcome label.
type LoRAOutcome uint8

// LoRA affinity outcomes.
const (
	// LoRANone: a base-model request (or affinity off): no outcome.
	LoRANone LoRAOutcome = iota
	// LoRARunning: the adapter was running or waiting there (scraped),
	// this picker had a request of it in flight there, or it was among the
	// last max_lora adapters this picker sent there (so most likely still
	// resident in the engine's adapter slots).
	LoRARunning
	// LoRARoom: it was not, but the endpoint runs fewer adapters than its
	// max_lora, so the adapter can be loaded without evicting one in use.
	LoRARoom
	// LoRAAny: neither (or the tier yielded to the balance guard).
	LoRAAny
	// NumLoRAOutcomes bounds the outcomes, for arrays indexed by them.
	NumLoRAOutcomes
)

// String returns the outcome's metric label ("" for LoRANone).
func (o LoRAOutcome) String() string {
	switch o {
	case LoRARunning:
		return "running"
	case LoRARoom:
		return "room"
	case LoRAAny:
		return "any"
	}
	return ""
}

// maxKnownAdapters bounds the adapter names the core learns from scrapes,
// so a pool whose adapters churn for months does not grow the set forever.
const maxKnownAdapters = 4096

// loraState is one endpoint's adapters as the core knows them.
type loraState struct {
	// running and waiting are the scraped adapter lists; max is max_lora
	// (0 unknown).
	running, waiting []string
	max              int
	// ours counts this picker's unfinished requests per adapter there.
	ours map[string]int
	// recent are the last max distinct adapters this picker sent there,
	// most recent first: what the engine most likely keeps resident, as
	// vLLM evicts the least recently used adapter. The scraped lists only
	// name adapters with requests in the engine, so without it an adapter
	// between two requests would look absent everywhere.
	recent []string
}

// setLoRA applies a fresh scrape's adapter state to e and learns the
// adapter names it lists.
func (c *Core) setLoRA(e *endpoint, m *podmetrics.Metrics) {
	if !m.Has(podmetrics.LoRA) {
		return
	}
	l := &e.lora
	l.running = append(l.running[:0], m.LoRA.Running...)
	l.waiting = append(l.waiting[:0], m.LoRA.Waiting...)
	l.max = m.LoRA.MaxLoRA
	if len(l.recent) > l.max {
		l.recent = l.recent[:l.max]
	}
	for _, lists := range [2][]string{m.LoRA.Running, m.LoRA.Waiting} {
		for _, a := range lists {
			if _, ok := c.adapters[a]; !ok && len(c.adapters) < maxKnownAdapters {
				if c.adapters == nil {
					c.adapters = map[string]struct{}{}
				}
				c.adapters[a] = struct{}{}
			}
		}
	}
}

// adapterOf is the adapter a ticket names: its model, when some endpoint
// has reported an adapter of that name; "" for the base model (and for an
// adapter no endpoint has run yet, which every endpoint can load alike).
func (c *Core) adapterOf(t *Ticket) string {
	if c.opts.DisableLoRAAffinity || len(c.adapters) == 0 || t.Model == "" {
		return ""
	}
	if _, ok := c.adapters[t.Model]; ok {
		return t.Model
	}
	return ""
}

// loraFit is where adapter a stands on e: 0 running there (or recently
// sent there), 1 a free slot for it (fewer adapters running, in flight or
// recently sent there than max_lora), 2 neither: loading it would evict
// one.
func (e *endpoint) loraFit(a string) uint8 {
	l := &e.lora
	if l.ours[a] > 0 || slices.Contains(l.running, a) || slices.Contains(l.waiting, a) || slices.Contains(l.recent, a) {
		return 0
	}
	if l.max > 0 {
		n := len(l.running)
		for x, k := range l.ours {
			if k > 0 && !slices.Contains(l.running, x) {
				n++
			}
		}
		for _, x := range l.recent {
			if l.ours[x] == 0 && !slices.Contains(l.running, x) {
				n++
			}
		}
		if n < l.max {
			return 1
		}
	}
	return 2
}

// sentAdapter records that this picker sent a request of adapter a to e:
// a moves to the front of e's recent adapters, which keep max_lora.
func (e *endpoint) sentAdapter(a string) {
	l := &e.lora
	if l.max <= 0 {
		return
	}
	if i := slices.Index(l.recent, a); i >= 0 {
		copy(l.recent[1:i+1], l.recent[:i])
		l.recent[0] = a
		return
	}
	if len(l.recent) < l.max {
		l.recent = append(l.recent, "")
	}
	copy(l.recent[1:], l.recent[:len(l.recent)-1])
	l.recent[0] = a
}

// setLoRATiers fills the candidates' LoRATier for an adapter request, the
// preference the choosers rank by within their fresh-and-not-busy tier,
// before load: 0 where the adapter runs, 1 where there is room for it, 2
// elsewhere. Base-model requests (and every request with affinity off)
// leave it 0 everywhere, so they are ranked by load alone.
//
// The balance guard keeps the tier from piling requests on one endpoint: a
// candidate holding more than twice the fewest in-flight requests among
// the fresh, not busy candidates, plus 16 (balanced), gets tier 2 whatever
// its adapters.
// With the busy test, which still gates every queueing class, and
// base-model requests going by load alone, an endpoint that adapter
// requests crowd is one the base-model requests avoid, never one they
// wait for.
func (c *Core) setLoRATiers(t *Ticket, cands []Candidate) {
	a := c.adapterOf(t)
	if a == "" {
		return
	}
	least := -1
	for i := range cands {
		if x := &cands[i]; !x.Busy && !x.Stale && (least < 0 || x.InFlight < least) {
			least = x.InFlight
		}
	}
	for i := range cands {
		x := &cands[i]
		x.LoRATier = 2
		if least < 0 || x.InFlight <= balanced(least) {
			x.LoRATier = c.reg.eps[x.ID].loraFit(a)
		}
	}
}

// balanced is the most in-flight requests an endpoint may hold and keep
// its LoRA tier, when the least loaded fresh, not busy candidate holds
// least: twice that plus loraSlack. An extra request on a busier endpoint
// costs one more sequence in its batch; a load elsewhere stalls that
// endpoint's whole batch and may evict an adapter in use soon, so only a
// gross imbalance breaks the affinity.
func balanced(least int) int { return 2*least + loraSlack }

// loraSlack is the in-flight requests an endpoint may hold beyond twice
// the least loaded's and keep its LoRA tier.
const loraSlack = 16

// noteAdapter records an adapter grant whose pick is c.cands[c.order[0]]:
// its outcome (the pick's tier) for metrics, and the request in flight with
// its adapter on the pick, and on the decode pod of a disaggregated grant.
func (c *Core) noteAdapter(g *Grant, t *Ticket) {
	a := c.adapterOf(t)
	if a == "" {
		return
	}
	x := g.extra()
	x.adapter = a
	switch c.cands[c.order[0]].LoRATier {
	case 0:
		g.LoRA = LoRARunning
	case 1:
		g.LoRA = LoRARoom
	default:
		g.LoRA = LoRAAny
	}
	g.ep.addAdapter(a, 1)
	g.ep.sentAdapter(a)
	if x.dec != nil {
		x.dec.addAdapter(a, 1)
		x.dec.sentAdapter(a)
	}
}

// addAdapter counts d more (or fewer) of our requests of adapter a on e.
func (e *endpoint) addAdapter(a string, d int) {
	l := &e.lora
	if l.ours == nil {
		l.ours = map[string]int{}
	}
	if l.ours[a] += d; l.ours[a] <= 0 {
		delete(l.ours, a)
	}
}

// adapterDone forgets a finished grant's adapter on e (the endpoint that
// held the request to its end).
func (c *Core) adapterDone(g *Grant, e *endpoint) {
	if g.x != nil && g.x.adapter != "" {
		e.addAdapter(g.x.adapter, -1)
	}
}
