package quality

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/internal/testbed/replay"
)

// The LoRA scenario (issue 24): 8 adapters over 4 modelsim servers that
// keep 2 resident at once and pay for loading another, a closed loop of
// requests spread uniformly over the adapters, through the real
// processes twice: the least-loaded picker without adapter affinity, and
// the default picker with it. The figures are the servers' own count of
// adapter loads and the throughput.
const (
	loraAdapters = 8
	loraServers  = 4
	loraMaxLoRAs = 2
	// loraClients is the closed loop's concurrency: 12 requests per server.
	loraClients = 48
	// loraSpeedup runs the model 4 times faster than its numbers say.
	loraSpeedup = 4
	// LoRARequests is the scenario's size in make bench-quality (the
	// issue's 2,000).
	LoRARequests = 2000
)

// loraEngine are the modelsim flags of the scenario's servers.
func loraEngine() []string {
	var names []string
	for i := range loraAdapters {
		names = append(names, "lora-"+strconv.Itoa(i+1))
	}
	return []string{
		"--lora-modules=" + strings.Join(names, ","), "--max-loras=" + strconv.Itoa(loraMaxLoRAs),
		"--lora-load-time=200ms", "--max-num-seqs=32", "--prefill-tokens-per-sec=20000",
		"--time-per-output-token=20ms", "--enable-prefix-caching=false", "--speedup=" + strconv.Itoa(loraSpeedup),
	}
}

// LoRARun is one picker's figures in the LoRA scenario.
type LoRARun struct {
	Name string
	// Loads is the servers' modelsim_lora_loads_total, summed.
	Loads float64
	// OK counts 200 answers; MakespanS is the first request to the last
	// answer, and RequestsPerS OK over it.
	OK           int
	MakespanS    float64
	RequestsPerS float64
	// Picks is laneway_lora_affinity_picks_total by outcome.
	Picks map[string]float64
}

// LoRAFigures are both runs over the same requests.
type LoRAFigures struct {
	Requests            int
	Baseline, Affinity  LoRARun
	Adapters, Servers   int
	MaxLoRAs, ClientsCC int
}

// Misses lists what the acceptance asks and the runs missed:
// adapter loads at most a third of the baseline's, throughput not lower,
// everything answered.
func (f *LoRAFigures) Misses() []string {
	var m []string
	if f.Affinity.Loads*3 > f.Baseline.Loads {
		m = append(m, fmt.Sprintf("adapter loads %.0f with affinity, %.0f least-loaded: want at most a third", f.Affinity.Loads, f.Baseline.Loads))
	}
	if f.Affinity.RequestsPerS < f.Baseline.RequestsPerS {
		m = append(m, fmt.Sprintf("throughput %.1f req/s with affinity, %.1f least-loaded: want not lower", f.Affinity.RequestsPerS, f.Baseline.RequestsPerS))
	}
	for _, r := range []LoRARun{f.Baseline, f.Affinity} {
		if r.OK != f.Requests {
			m = append(m, fmt.Sprintf("%s: %d of %d answered 200", r.Name, r.OK, f.Requests))
		}
	}
	return m
}

// loraRequest is one request of the scenario.
type loraRequest struct {
	body []byte
}

// loraRequests are n requests spread uniformly over the adapters, with
// distinct token-id prompts of 100-400 tokens and 8-48 output tokens,
// the same for a seed.
func loraRequests(n int, seed uint64) []loraRequest {
	r := rand.New(rand.NewPCG(seed, 24))
	out := make([]loraRequest, n)
	for i := range out {
		var b bytes.Buffer
		fmt.Fprintf(&b, `{"model":"lora-%d","stream":true,"max_tokens":%d,"prompt":[`, 1+r.IntN(loraAdapters), 8+r.IntN(41))
		for j := range 100 + r.IntN(301) {
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(1_000_000 + i*512 + j))
		}
		b.WriteString("]}")
		out[i].body = b.Bytes()
	}
	return out
}

// RunLoRA runs the LoRA scenario with n requests through the binaries in
// bins, writing the processes' logs under dir.
func RunLoRA(ctx context.Context, bins launch.Binaries, dir string, n int) (*LoRAFigures, error) {
	f := &LoRAFigures{Requests: n, Adapters: loraAdapters, Servers: loraServers, MaxLoRAs: loraMaxLoRAs, ClientsCC: loraClients}
	reqs := loraRequests(n, 1)
	var err error
	if f.Baseline, err = runLoRA(ctx, bins, filepath.Join(dir, "least-loaded"), reqs,
		"least-loaded, no affinity", "--picker=least-loaded", "--lora-affinity=false"); err != nil {
		return nil, err
	}
	if f.Affinity, err = runLoRA(ctx, bins, filepath.Join(dir, "affinity"), reqs, "laneway, LoRA affinity"); err != nil {
		return nil, err
	}
	return f, nil
}

// runLoRA is one run on fresh servers, with the picker's extra flags.
func runLoRA(ctx context.Context, bins launch.Binaries, dir string, reqs []loraRequest, name string, args ...string) (run LoRARun, err error) {
	const simIP = "127.0.0.2"
	run.Name = name
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return run, err
	}
	var procs []*launch.Proc
	defer func() {
		for i := len(procs) - 1; i >= 0; i-- {
			if serr := procs[i].Stop(10 * time.Second); serr != nil && err == nil {
				err = fmt.Errorf("%s: %w\n%s", procs[i].Name, serr, procs[i].Log.Tail(2000))
			}
			_ = os.WriteFile(filepath.Join(dir, strings.ReplaceAll(procs[i].Name, ":", "_")+".log"), []byte(procs[i].Log.String()), 0o644)
		}
	}()
	proc := func(name string) launch.ProcOptions { return launch.ProcOptions{Name: name, LogLimit: 1 << 20} }
	var sims []*launch.Sim
	var addrs []string
	for i := range loraServers {
		s, err := bins.StartSim(ctx, launch.SimOptions{Host: simIP, Args: loraEngine(), Proc: proc(fmt.Sprintf("modelsim-%d", i))})
		if err != nil {
			return run, err
		}
		procs = append(procs, s.Proc)
		sims = append(sims, s)
		addrs = append(addrs, s.Addr)
	}
	epp, err := bins.StartEPP(ctx, launch.EPPOptions{Endpoints: addrs,
		Args: append([]string{"--scrape-interval=50ms"}, args...), Proc: proc("epp")})
	if err != nil {
		return run, err
	}
	procs = append(procs, epp.Proc)
	gw, err := bins.StartGateway(ctx, launch.GatewayOptions{EPP: epp, Proc: proc("gateway")})
	if err != nil {
		return run, err
	}
	procs = append(procs, gw.Proc)
	if err := replay.AwaitScraped(ctx, epp.Metrics, len(addrs)); err != nil {
		return run, err
	}
	run.OK, run.MakespanS, err = closedLoop(ctx, gw.URL+"/v1/completions", reqs, loraClients)
	if err != nil {
		return run, err
	}
	run.RequestsPerS = float64(run.OK) / run.MakespanS
	for _, s := range sims {
		m, err := s.Metrics.Scrape(ctx)
		if err != nil {
			return run, err
		}
		run.Loads += m.Value("modelsim_lora_loads_total")
	}
	m, err := epp.Metrics.Scrape(ctx)
	if err != nil {
		return run, err
	}
	run.Picks = map[string]float64{}
	for _, o := range []string{"running", "room", "any"} {
		run.Picks[o] = m.Value("laneway_lora_affinity_picks_total", "outcome", o)
	}
	return run, nil
}

// closedLoop sends reqs in order from c clients, each sending its next
// request when its last answer ended, and returns the 200 answers and
// the seconds from the first request to the last answer.
func closedLoop(ctx context.Context, url string, reqs []loraRequest, c int) (ok int, makespan float64, err error) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, DisableCompression: true}, Timeout: 5 * time.Minute}
	next := make(chan int)
	var mu sync.Mutex
	var failures []string
	var wg sync.WaitGroup
	begin := time.Now()
	for range c {
		wg.Go(func() {
			for i := range next {
				status, err := post(ctx, client, url, reqs[i].body)
				mu.Lock()
				if status == http.StatusOK {
					ok++
				} else if len(failures) < 3 {
					failures = append(failures, fmt.Sprintf("request %d: status %d, %v", i, status, err))
				}
				mu.Unlock()
			}
		})
	}
	for i := range reqs {
		select {
		case next <- i:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
	makespan = time.Since(begin).Seconds()
	if len(failures) > 0 {
		return ok, makespan, fmt.Errorf("%d of %d failed; first: %s", len(reqs)-ok, len(reqs), strings.Join(failures, "; "))
	}
	return ok, makespan, ctx.Err()
}

// post sends one streaming request and reads its answer to the end.
func post(ctx context.Context, client *http.Client, url string, body []byte) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("content-type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode == http.StatusOK && !bytes.Contains(b, []byte("[DONE]")) {
		return 0, fmt.Errorf("stream ended without [DONE]")
	}
	return resp.StatusCode, err
}

// WriteLoRA prints the LoRA scenario's figures.
func WriteLoRA(w io.Writer, f *LoRAFigures) {
	fmt.Fprintf(w, "\n== LoRA adapters: %d adapters over %d servers of %d slots, %d requests, %d clients\n",
		f.Adapters, f.Servers, f.MaxLoRAs, f.Requests, f.ClientsCC)
	for _, r := range []LoRARun{f.Baseline, f.Affinity} {
		picks := ""
		if r.Picks["running"]+r.Picks["room"]+r.Picks["any"] > 0 {
			keys := []string{"running", "room", "any"}
			var parts []string
			for _, k := range keys {
				parts = append(parts, fmt.Sprintf("%s %.0f", k, r.Picks[k]))
			}
			picks = "; picks " + strings.Join(parts, ", ")
		}
		fmt.Fprintf(w, "  %-28s adapter loads %5.0f; %d ok in %.1f s (%.1f req/s)%s\n", r.Name, r.Loads, r.OK, r.MakespanS, r.RequestsPerS, picks)
	}
	if f.Baseline.Loads > 0 {
		fmt.Fprintf(w, "  loads with affinity / least-loaded: %.3f (want <= 0.333); throughput ratio %.2f (want >= 1)\n",
			f.Affinity.Loads/f.Baseline.Loads, f.Affinity.RequestsPerS/f.Baseline.RequestsPerS)
	}
}
