package replay

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/laneway-dev/laneway/internal/testbed/gateway"
	"github.com/laneway-dev/laneway/internal/testbed/simulate"
	"github.com/laneway-dev/laneway/pkg/policy"
)

// DefaultModel is the model name a replay asks for: modelsim's default.
const DefaultModel = "sim-model"

// StatusBroken is the status of a request whose response began (200) but
// ended without [DONE]: the stream broke or the server aborted it.
const StatusBroken = 502

// Options are a replay's settings besides the trace and the policy.
type Options struct {
	// URL is the gateway's base URL, e.g. "http://127.0.0.1:8080".
	URL string
	// Servers are the model servers' addresses (host:port) in the fleet's
	// order: the x-laneway-endpoint of a response names its server's
	// index. An address not listed takes the next index when first seen.
	Servers []string
	// Model is the body's model (default DefaultModel).
	Model string
	// Client sends the requests (default: one with enough idle
	// connections for every request in flight, no timeout: a request ends
	// with its stream or ctx).
	Client *http.Client
	// Progress, when set, is called about once a second with the requests
	// that have ended and the total.
	Progress func(done, total int)
}

// Run replays t open loop through o.URL and returns the outcomes as a
// result of policy p (the policy the picker runs: it names the classes).
// Times are on the trace's clock: the first arrival is sent at once and
// every other one its arrival minus the first's later. The error names
// requests that failed at the transport (their status stays 0); the result
// is complete either way, unless ctx ended first.
func Run(ctx context.Context, t *simulate.Trace, p *simulate.Policy, o Options) (*simulate.Result, error) {
	if len(t.Requests) == 0 {
		return nil, errors.New("replay: the trace has no requests")
	}
	r := &replay{trace: t, pol: p, opts: o, res: simulate.NewResult(t, p), servers: map[string]int32{}}
	r.model = cmp.Or(o.Model, DefaultModel)
	for i, a := range o.Servers {
		r.servers[a] = int32(i)
	}
	r.client = o.Client
	if r.client == nil {
		r.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4096, DisableCompression: true}}
	}
	order := make([]int, len(t.Requests))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(t.Requests[a].Arrival, t.Requests[b].Arrival) })
	r.t0 = t.Requests[order[0]].Arrival

	stopProgress := r.progress(len(order))
	defer stopProgress()
	var wg sync.WaitGroup
	r.begin = time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for _, i := range order {
		if d := time.Duration(t.Requests[i].Arrival-r.t0) - time.Since(r.begin); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
				wg.Wait()
				return nil, ctx.Err()
			}
		}
		wg.Go(func() { r.send(ctx, i) })
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r.res.Wall = time.Since(r.begin)
	for i := range r.res.Outcomes {
		if r.res.Outcomes[i].Leave >= 0 {
			r.res.Decisions++
		}
	}
	if n := r.failed.Load(); n > 0 {
		return r.res, fmt.Errorf("replay: %d of %d requests failed at the transport, the first: %v", n, len(order), r.firstErr.Load())
	}
	return r.res, nil
}

// replay is one run's state. Each request's goroutine writes only its own
// outcome.
type replay struct {
	trace  *simulate.Trace
	pol    *simulate.Policy
	opts   Options
	model  string
	client *http.Client
	res    *simulate.Result
	t0     int64
	begin  time.Time

	mu      sync.Mutex // guards servers
	servers map[string]int32

	done     atomic.Int64
	failed   atomic.Int64
	firstErr atomic.Value // error
}

// now is the time on the trace's clock.
func (r *replay) now() int64 { return r.t0 + int64(time.Since(r.begin)) }

// progress calls Options.Progress every second until the returned stop.
func (r *replay) progress(total int) (stop func()) {
	if r.opts.Progress == nil {
		return func() {}
	}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				r.opts.Progress(int(r.done.Load()), total)
			case <-quit:
				r.opts.Progress(int(r.done.Load()), total)
				return
			}
		}
	})
	return func() { close(quit); wg.Wait() }
}

// serverIndex numbers a server address.
func (r *replay) serverIndex(addr string) int32 {
	if addr == "" {
		return -1
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	i, ok := r.servers[addr]
	if !ok {
		i = int32(len(r.servers))
		r.servers[addr] = i
	}
	return i
}

func (r *replay) fail(err error) {
	r.failed.Add(1)
	r.firstErr.CompareAndSwap(nil, err)
}

// send sends request i and records what it saw.
func (r *replay) send(ctx context.Context, i int) {
	defer r.done.Add(1)
	q := &r.trace.Requests[i]
	o := &r.res.Outcomes[i]
	o.Attempts = 1
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.opts.URL+"/v1/completions", bytes.NewReader(Body(r.trace, i, r.model)))
	if err != nil {
		r.fail(err)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	SetHeaders(req.Header, q)
	resp, err := r.client.Do(req)
	if err != nil {
		r.fail(fmt.Errorf("request %d: %w", i, err))
		return
	}
	defer resp.Body.Close()
	o.Leave = r.now()
	o.Class = r.pol.ClassIndex(q, uint64(q.PromptTokens))
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		o.Status = int16(resp.StatusCode)
		return
	}
	o.Server = r.serverIndex(resp.Header.Get(gateway.HeaderServedBy))
	o.Status = StatusBroken
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
		if !ok {
			continue
		}
		if string(data) == "[DONE]" {
			o.End = r.now()
			o.Status = http.StatusOK
			break
		}
		if bytes.Contains(data, []byte(`"usage"`)) || bytes.Contains(data, []byte(`"error"`)) {
			var ev struct {
				Usage *struct {
					Details *struct {
						CachedTokens uint32 `json:"cached_tokens"`
					} `json:"prompt_tokens_details"`
				} `json:"usage"`
				Error json.RawMessage `json:"error"`
			}
			if json.Unmarshal(data, &ev) == nil {
				if ev.Error != nil {
					break // an aborted stream: StatusBroken
				}
				if ev.Usage != nil {
					if ev.Usage.Details != nil {
						o.EngineCached = ev.Usage.Details.CachedTokens
						o.Cached = o.EngineCached
					}
					continue
				}
			}
		}
		if o.First < 0 {
			o.First = r.now()
		}
	}
	if err := sc.Err(); err != nil && o.Status != http.StatusOK {
		r.fail(fmt.Errorf("request %d: reading the stream: %w", i, err))
	}
	o.Class = r.pol.ClassIndex(q, uint64(q.PromptTokens-min(int(o.EngineCached), q.PromptTokens)))
}

// Body is the JSON body of trace request i: a streaming completion of the
// request's output length with its token-id prompt, usage included.
func Body(t *simulate.Trace, i int, model string) []byte {
	q := &t.Requests[i]
	ids := t.AppendPrompt(make([]uint32, 0, q.PromptTokens), i)
	b := make([]byte, 0, 128+len(model)+9*len(ids))
	b = append(b, `{"model":`...)
	b = strconv.AppendQuote(b, model)
	b = append(b, `,"stream":true,"stream_options":{"include_usage":true},"max_tokens":`...)
	b = strconv.AppendInt(b, int64(q.OutputTokens), 10)
	b = append(b, `,"prompt":[`...)
	for j, id := range ids {
		if j > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(id), 10)
	}
	return append(b, "]}"...)
}

// SetHeaders sets the picker's hint headers a request carries: its class,
// tenant, priority and strict priority (SPEC §3, §6, §14).
func SetHeaders(h http.Header, q *simulate.Request) {
	if q.Class != "" {
		h.Set(policy.HeaderPolicyClass, q.Class)
	}
	if q.Tenant != "" {
		h.Set(policy.TenantHeader, q.Tenant)
	}
	if q.HasPriority {
		h.Set(policy.HeaderPriority, strconv.Itoa(int(q.Priority)))
	}
	if q.Strict > 0 {
		h.Set(policy.HeaderStrictPriority, strconv.FormatUint(uint64(q.Strict), 10))
	}
}
