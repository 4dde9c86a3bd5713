package simulate

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
)

// Rule assigns a class header or a tenant to the requests of a trace that
// carry none (an Azure trace carries neither). The forms:
//
//	length:NAME<N,NAME<M,...,NAME   by prompt tokens: below N the first
//	                                name, below M the second, ..., else the
//	                                last (N < M < ...)
//	split:NAME=W,NAME=W,...         a seeded random draw in proportion to
//	                                the weights W (any positive numbers)
//	uniform:N[/PREFIX]              N names PREFIX-1 ... PREFIX-N (default
//	                                prefix t), drawn uniformly
type Rule struct {
	spec    string
	names   []string
	bounds  []int     // length: upper bounds, one fewer than names
	weights []float64 // split: cumulative, normalised to 1
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

// ParseRule reads a rule (see Rule).
func ParseRule(spec string) (*Rule, error) {
	kind, body, ok := strings.Cut(strings.TrimSpace(spec), ":")
	if !ok || body == "" {
		return nil, fmt.Errorf("rule %q: want length:..., split:... or uniform:N", spec)
	}
	r := &Rule{spec: spec}
	bad := func(format string, a ...any) (*Rule, error) {
		return nil, fmt.Errorf("rule %q: %s", spec, fmt.Sprintf(format, a...))
	}
	switch kind {
	case "length":
		parts := strings.Split(body, ",")
		for i, p := range parts {
			if i == len(parts)-1 {
				if !nameRE.MatchString(p) {
					return bad("the last entry %q must be a bare name (the rest)", p)
				}
				r.names = append(r.names, p)
				break
			}
			name, n, ok := strings.Cut(p, "<")
			v, err := strconv.Atoi(n)
			if !ok || err != nil || v < 1 || !nameRE.MatchString(name) {
				return bad("entry %q: want NAME<TOKENS", p)
			}
			if len(r.bounds) > 0 && v <= r.bounds[len(r.bounds)-1] {
				return bad("bounds must increase (%d after %d)", v, r.bounds[len(r.bounds)-1])
			}
			r.names = append(r.names, name)
			r.bounds = append(r.bounds, v)
		}
		if len(parts) < 2 {
			return bad("want at least one NAME<TOKENS and a last name")
		}
	case "split":
		sum := 0.0
		for _, p := range strings.Split(body, ",") {
			name, w, ok := strings.Cut(p, "=")
			v, err := strconv.ParseFloat(w, 64)
			if !ok || err != nil || !(v > 0) || v > 1e12 || !nameRE.MatchString(name) {
				return bad("entry %q: want NAME=WEIGHT with a positive weight", p)
			}
			sum += v
			r.names = append(r.names, name)
			r.weights = append(r.weights, sum)
		}
		for i := range r.weights {
			r.weights[i] /= sum
		}
	case "uniform":
		n, prefix, _ := strings.Cut(body, "/")
		if prefix == "" {
			prefix = "t"
		}
		k, err := strconv.Atoi(n)
		if err != nil || k < 1 || k > 1_000_000 || !nameRE.MatchString(prefix) {
			return bad("want uniform:N or uniform:N/PREFIX with 1 <= N <= 1000000")
		}
		for i := 1; i <= k; i++ {
			r.names = append(r.names, prefix+"-"+strconv.Itoa(i))
		}
	default:
		return bad("unknown kind %q (want length, split or uniform)", kind)
	}
	return r, nil
}

// String returns the rule as written.
func (r *Rule) String() string { return r.spec }

// assign picks the name for one request.
func (r *Rule) assign(req *Request, rng *rand.Rand) string {
	switch {
	case r.bounds != nil:
		for i, b := range r.bounds {
			if req.PromptTokens < b {
				return r.names[i]
			}
		}
		return r.names[len(r.names)-1]
	case r.weights != nil:
		x := rng.Float64()
		for i, w := range r.weights {
			if x < w {
				return r.names[i]
			}
		}
		return r.names[len(r.names)-1]
	}
	return r.names[rng.IntN(len(r.names))]
}

// Assign gives the requests that carry no class header a class by
// classRule, and those that carry no tenant a tenant by tenantRule (either
// may be nil). Random draws come from seed, so a trace is assigned the same
// way on every run.
func (t *Trace) Assign(classRule, tenantRule *Rule, seed uint64) {
	rc := rand.New(rand.NewPCG(seed, 0xc1a55))
	rt := rand.New(rand.NewPCG(seed, 0x7e4a47))
	for i := range t.Requests {
		req := &t.Requests[i]
		if classRule != nil && req.Class == "" {
			req.Class = classRule.assign(req, rc)
		}
		if tenantRule != nil && req.Tenant == "" {
			req.Tenant = tenantRule.assign(req, rt)
		}
	}
}
