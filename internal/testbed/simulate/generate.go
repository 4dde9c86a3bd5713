package simulate

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
)

// GenerateGrammar documents --generate (the text of `laneway simulate
// --help` and docs/simulate.md).
const GenerateGrammar = `SPEC is one or more streams separated by ";", each a comma-separated list
of key=value:
  class=NAME        class header of the stream's requests (default none)
  tenant=NAME       tenant of every request (default none)
  tenants=N         spread the requests uniformly over N tenants NAME-1..NAME-N
                    (NAME from tenant=, default t)
  arrival=KIND      poisson (default), uniform (evenly spaced), bursty
                    (poisson during on=, nothing during off=), or once (count=
                    requests all at start=)
  rate=R            requests per second (poisson, uniform, bursty: during on)
  on=D, off=D       bursty periods, e.g. on=5s,off=15s
  start=D           first possible arrival (default 0)
  duration=D        the stream ends at start+D
  count=N           at most N requests (once: exactly N)
  prompt=SIZE       prompt tokens: N, A-B (uniform), or ~M (exponential, mean M)
  output=SIZE       output tokens, same forms (default 16)
  prefix=N          the first N prompt tokens are shared within a group
  groups=N          prefix groups per stream, drawn uniformly (default 1)
  priority=P        soft priority hint (higher first); strict=S strict tier
  adapter=NAME      the LoRA adapter every request's model names (default none)
  adapters=N        spread the requests uniformly over N adapters NAME-1..NAME-N
                    (NAME from adapter=, default lora)
Streams are merged by arrival, ties interleaved (stream 1's first, stream 2's
first, ...); the same --seed gives the same trace.
Example: class=interactive,rate=20,prompt=100-400,output=~150,duration=10m;
         class=batch,rate=2,prompt=2000-6000,output=~300,duration=10m`

// size is a token-count distribution of --generate.
type size struct {
	lo, hi int     // uniform [lo, hi]; lo == hi is fixed
	mean   float64 // > 0: exponential with this mean
}

func parseSize(s string) (size, error) {
	if m, ok := strings.CutPrefix(s, "~"); ok {
		v, err := strconv.ParseFloat(m, 64)
		if err != nil || !(v >= 1) || v > 1e9 {
			return size{}, fmt.Errorf("size %q: want ~MEAN with a mean >= 1", s)
		}
		return size{mean: v}, nil
	}
	a, b, isRange := strings.Cut(s, "-")
	lo, err := strconv.Atoi(a)
	hi := lo
	if err == nil && isRange {
		hi, err = strconv.Atoi(b)
	}
	if err != nil || lo < 1 || hi < lo || hi > 1e9 {
		return size{}, fmt.Errorf("size %q: want N, A-B (1 <= A <= B) or ~MEAN", s)
	}
	return size{lo: lo, hi: hi}, nil
}

func (z size) draw(r *rand.Rand) int {
	if z.mean > 0 {
		return max(1, int(math.Round(r.ExpFloat64()*z.mean)))
	}
	if z.hi == z.lo {
		return z.lo
	}
	return z.lo + r.IntN(z.hi-z.lo+1)
}

// stream is one parsed --generate stream.
type stream struct {
	class, tenant       string
	tenants             int
	arrival             string
	rate                float64
	on, off, start, dur time.Duration
	count               int
	prompt, output      size
	prefix, groups      int
	priority            *int32
	strict              uint32
	adapter             string
	adapters            int
}

func parseStream(i int, text string) (*stream, error) {
	s := &stream{arrival: "poisson", output: size{lo: DefaultOutputTokens, hi: DefaultOutputTokens}, groups: 1}
	seen := map[string]bool{}
	hasPrompt := false
	for _, kv := range strings.Split(text, ",") {
		kv = strings.TrimSpace(kv)
		k, v, ok := strings.Cut(kv, "=")
		if !ok || v == "" {
			return nil, fmt.Errorf("stream %d: %q: want key=value", i+1, kv)
		}
		if seen[k] {
			return nil, fmt.Errorf("stream %d: %s given twice", i+1, k)
		}
		seen[k] = true
		var err error
		num := func() (int, error) {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return 0, fmt.Errorf("want a count >= 0")
			}
			return n, nil
		}
		dur := func() (time.Duration, error) {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return 0, fmt.Errorf("want a duration >= 0 like 10m or 500ms")
			}
			return d, nil
		}
		switch k {
		case "class", "tenant":
			if !nameRE.MatchString(v) {
				err = fmt.Errorf("want a name of [A-Za-z0-9_.-]")
			} else if k == "class" {
				s.class = v
			} else {
				s.tenant = v
			}
		case "tenants":
			s.tenants, err = num()
		case "adapter":
			if !nameRE.MatchString(v) {
				err = fmt.Errorf("want a name of [A-Za-z0-9_.-]")
			}
			s.adapter = v
		case "adapters":
			s.adapters, err = num()
		case "arrival":
			switch v {
			case "poisson", "uniform", "bursty", "once":
				s.arrival = v
			default:
				err = fmt.Errorf("want poisson, uniform, bursty or once")
			}
		case "rate":
			s.rate, err = strconv.ParseFloat(v, 64)
			if err != nil || !(s.rate > 0) || math.IsInf(s.rate, 0) {
				err = fmt.Errorf("want a positive number of requests per second")
			}
		case "on":
			s.on, err = dur()
		case "off":
			s.off, err = dur()
		case "start":
			s.start, err = dur()
		case "duration":
			s.dur, err = dur()
		case "count":
			s.count, err = num()
		case "prompt":
			s.prompt, err = parseSize(v)
			hasPrompt = true
		case "output":
			s.output, err = parseSize(v)
		case "prefix":
			s.prefix, err = num()
		case "groups":
			s.groups, err = num()
		case "priority":
			var p int64
			p, err = strconv.ParseInt(v, 10, 32)
			p32 := int32(p)
			s.priority = &p32
		case "strict":
			var p uint64
			p, err = strconv.ParseUint(v, 10, 32)
			s.strict = uint32(p)
		default:
			err = fmt.Errorf("unknown key (see --help)")
		}
		if err != nil {
			return nil, fmt.Errorf("stream %d: %s=%s: %w", i+1, k, v, err)
		}
	}
	switch {
	case !hasPrompt:
		return nil, fmt.Errorf("stream %d: prompt= is required", i+1)
	case s.arrival == "once" && s.count < 1:
		return nil, fmt.Errorf("stream %d: arrival=once needs count=N", i+1)
	case s.arrival != "once" && s.rate == 0:
		return nil, fmt.Errorf("stream %d: arrival=%s needs rate=R", i+1, s.arrival)
	case s.arrival != "once" && s.dur == 0 && s.count == 0:
		return nil, fmt.Errorf("stream %d: give duration= or count= (or both)", i+1)
	case s.arrival == "bursty" && (s.on == 0 || s.off == 0):
		return nil, fmt.Errorf("stream %d: arrival=bursty needs on= and off=", i+1)
	case s.groups < 1:
		return nil, fmt.Errorf("stream %d: groups=%d: want >= 1", i+1, s.groups)
	}
	return s, nil
}

// maxGenerated bounds a generated trace (a typo in rate= must not eat the
// machine's memory).
const maxGenerated = 50_000_000

// Generate builds a synthetic trace from a SPEC (GenerateGrammar), seeded:
// the same spec and seed give the same trace.
func Generate(spec string, seed uint64) (*Trace, error) {
	var streams []*stream
	for _, text := range strings.FieldsFunc(spec, func(r rune) bool { return r == ';' || r == '\n' }) {
		if strings.TrimSpace(text) == "" {
			continue
		}
		s, err := parseStream(len(streams), text)
		if err != nil {
			return nil, fmt.Errorf("--generate: %w", err)
		}
		streams = append(streams, s)
	}
	if len(streams) == 0 {
		return nil, fmt.Errorf("--generate %q: no stream", spec)
	}
	type gen struct {
		Request
		local, stream int
	}
	var all []gen
	for si, s := range streams {
		r := rand.New(rand.NewPCG(seed, uint64(si)+1))
		label := s.class
		if label == "" {
			label = "s" + strconv.Itoa(si+1)
		}
		tenantBase := s.tenant
		if tenantBase == "" {
			tenantBase = "t"
		}
		end := time.Duration(math.MaxInt64)
		if s.dur > 0 {
			end = s.start + s.dur
		}
		at, onTime := s.start, time.Duration(0)
		for n := 0; ; n++ {
			if s.count > 0 && n >= s.count {
				break
			}
			if len(all) >= maxGenerated {
				return nil, fmt.Errorf("--generate: more than %d requests; lower rate= or duration=", maxGenerated)
			}
			switch s.arrival {
			case "once":
			case "uniform":
				if n > 0 {
					at += time.Duration(float64(time.Second) / s.rate)
				}
			case "poisson":
				at += time.Duration(r.ExpFloat64() / s.rate * float64(time.Second))
			case "bursty":
				// A Poisson process in on-time, mapped onto the clock:
				// every on period is followed by an off period.
				onTime += time.Duration(r.ExpFloat64() / s.rate * float64(time.Second))
				at = s.start + onTime/s.on*(s.on+s.off) + onTime%s.on
			}
			if at >= end {
				break
			}
			q := Request{Arrival: int64(at), Class: s.class, Tenant: s.tenant,
				PromptTokens: s.prompt.draw(r), OutputTokens: s.output.draw(r), Strict: s.strict}
			if s.tenants > 0 {
				q.Tenant = tenantBase + "-" + strconv.Itoa(1+r.IntN(s.tenants))
			}
			q.Adapter = s.adapter
			if s.adapters > 0 {
				q.Adapter = cmp.Or(s.adapter, "lora") + "-" + strconv.Itoa(1+r.IntN(s.adapters))
			}
			if s.prefix > 0 {
				q.PrefixGroup = label + "-g" + strconv.Itoa(1+r.IntN(s.groups))
				q.PrefixTokens = s.prefix
			}
			if s.priority != nil {
				q.Priority, q.HasPriority = *s.priority, true
			}
			all = append(all, gen{Request: q, local: n, stream: si})
		}
	}
	slices.SortStableFunc(all, func(a, b gen) int {
		if c := cmp.Compare(a.Arrival, b.Arrival); c != 0 {
			return c
		}
		if a.local != b.local {
			return a.local - b.local
		}
		return a.stream - b.stream
	})
	t := &Trace{Source: "--generate " + spec, Requests: make([]Request, len(all))}
	for i := range all {
		t.Requests[i] = all[i].Request
	}
	if err := t.finish(); err != nil {
		return nil, fmt.Errorf("--generate: %w", err)
	}
	return t, nil
}
