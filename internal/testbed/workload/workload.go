package workload

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Spec describes one weighted-share run.
type Spec struct {
	// URL is the completions endpoint, e.g. http://127.0.0.1:8080/v1/completions.
	URL string
	// URLs, when set, replaces URL: the requests of each class are dealt
	// to them in turn (round i of the interleaving goes to URLs[i mod n]),
	// so each gets an equal share of every class, as when several
	// gateways or pickers split one workload.
	URLs []string
	// Model is the body's model field.
	Model string
	// Classes are the class header values, e.g. premium and regular.
	Classes []string
	// PerClass is the number of requests of each class (320 in SPEC §11).
	PerClass int
	// PromptTokens is each prompt's exact length (512 in SPEC §11); prompts
	// are token-id arrays, distinct across every request of a run.
	PromptTokens int
	// ClassHeader is the header naming the class; default
	// x-dynamo-meta-policy-class (the reference router's).
	ClassHeader string
	// Client sends the requests; nil uses a client without a pool limit.
	Client *http.Client
	// Progress, if set, is called after every completion.
	Progress func(done, total int)
	// Seed makes prompts distinct across runs.
	Seed int
	// Mix, when set, replaces Classes, PerClass and PromptTokens: groups
	// of requests with their own count, prompt length and headers (for
	// example one tenant each), released together and interleaved one
	// request of each group in turn while it has any left.
	Mix []Group
	// RequestIDHeader, when set, names a header carrying each request's
	// own id ("<label>-<n>", n from 0 within its group), which
	// Completion.ID repeats: a test can then match what servers recorded.
	RequestIDHeader string
}

// Group is one part of a Mix. Completion.Class is its Label.
type Group struct {
	Label        string
	Count        int
	PromptTokens int
	// Headers are sent with each of its requests.
	Headers map[string]string
}

// Completion is one finished request.
type Completion struct {
	Class string
	// ID is the request's id when Spec.RequestIDHeader is set.
	ID     string
	Status int
	// At is the time from the start of the run to the end of the response.
	At time.Duration
	// Endpoint is the x-laneway-endpoint response header, if any.
	Endpoint string
	// Err is set when the request failed at the transport.
	Err error
}

// Result is a run's completions in the order they finished.
type Result struct {
	Spec        Spec
	Completions []Completion
	Elapsed     time.Duration
}

// Run releases every request at once, interleaved across classes, and
// waits for all of them (or ctx).
func Run(ctx context.Context, s Spec) (*Result, error) {
	if s.ClassHeader == "" {
		s.ClassHeader = "x-dynamo-meta-policy-class"
	}
	if len(s.Mix) == 0 {
		if s.PerClass <= 0 || len(s.Classes) == 0 || s.PromptTokens <= 0 {
			return nil, errors.New("workload: need classes, PerClass > 0 and PromptTokens > 0, or a Mix")
		}
		for _, c := range s.Classes {
			s.Mix = append(s.Mix, Group{Label: c, Count: s.PerClass, PromptTokens: s.PromptTokens,
				Headers: map[string]string{s.ClassHeader: c}})
		}
	}
	client := s.Client
	if client == nil {
		client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, MaxConnsPerHost: 0}}
	}
	type job struct {
		g    *Group
		body []byte
		id   string
		url  string
	}
	stride := 0 // the longest prompt: prompts start stride token ids apart
	for _, g := range s.Mix {
		stride = max(stride, g.PromptTokens)
	}
	var jobs []job
	for i := 0; ; i++ {
		added := false
		for gi := range s.Mix {
			g := &s.Mix[gi]
			if g.PromptTokens <= 0 {
				return nil, fmt.Errorf("workload: group %q needs PromptTokens > 0", g.Label)
			}
			if i < g.Count {
				jobs = append(jobs, job{g, promptBodyAt(s.Model, s.Seed, len(jobs)*stride, g.PromptTokens), g.Label + "-" + strconv.Itoa(i), s.urlOf(i)})
				added = true
			}
		}
		if !added {
			break
		}
	}
	total := len(jobs)
	var (
		mu    sync.Mutex
		res   = &Result{Spec: s}
		wg    sync.WaitGroup
		start = time.Now()
		gate  = make(chan struct{})
	)
	for _, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			c := send(ctx, client, j.url, s, j.g, j.body, j.id)
			c.At = time.Since(start)
			mu.Lock()
			res.Completions = append(res.Completions, c)
			n := len(res.Completions)
			mu.Unlock()
			if s.Progress != nil {
				s.Progress(n, total)
			}
		}()
	}
	start = time.Now()
	close(gate)
	wg.Wait()
	res.Elapsed = time.Since(start)
	return res, ctx.Err()
}

// promptBody is a streaming completions request whose prompt is n-th
// distinct token-id sequence of the run: exact length, no shared prefix.
func promptBody(model string, seed, n, tokens int) []byte {
	return promptBodyAt(model, seed, n*tokens, tokens)
}

// promptBodyAt is promptBody for the prompt of tokens ids starting at
// offset (prompts of a run take disjoint ranges).
func promptBodyAt(model string, seed, offset, tokens int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"model":`)
	mb, _ := json.Marshal(model)
	b.Write(mb)
	b.WriteString(`,"max_tokens":1,"stream":true,"prompt":[`)
	base := 1_000_000*(seed+1) + offset
	for i := 0; i < tokens; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(base + i))
	}
	b.WriteString("]}")
	return b.Bytes()
}

// urlOf is where the requests of interleaving round i go.
func (s *Spec) urlOf(i int) string {
	if len(s.URLs) == 0 {
		return s.URL
	}
	return s.URLs[i%len(s.URLs)]
}

func send(ctx context.Context, client *http.Client, url string, s Spec, g *Group, body []byte, id string) Completion {
	c := Completion{Class: g.Label}
	if s.RequestIDHeader != "" {
		c.ID = id
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		c.Err = err
		return c
	}
	req.Header.Set("content-type", "application/json")
	for k, v := range g.Headers {
		req.Header.Set(k, v)
	}
	if c.ID != "" {
		req.Header.Set(s.RequestIDHeader, c.ID)
	}
	resp, err := client.Do(req)
	if err != nil {
		c.Err = err
		return c
	}
	defer resp.Body.Close()
	c.Status = resp.StatusCode
	c.Endpoint = resp.Header.Get("x-laneway-endpoint")
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		c.Err = fmt.Errorf("status %d: %s", resp.StatusCode, strings.TrimSpace(string(msg)))
		return c
	}
	// Read the SSE stream to its end: completion is the last byte.
	sc := bufio.NewScanner(resp.Body)
	sawDone := false
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "data: [DONE]" {
			sawDone = true
		}
	}
	if err := sc.Err(); err != nil {
		c.Err = err
	} else if !sawDone {
		c.Err = errors.New("stream ended without data: [DONE]")
	}
	return c
}
