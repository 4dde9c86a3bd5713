package simulate

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/laneway-dev/laneway/pkg/tokenize"
)

// DefaultOutputTokens is the output of a request whose trace line names
// none: modelsim's (and vLLM's completions) max_tokens default.
const DefaultOutputTokens = 16

// Request is one request of a trace.
type Request struct {
	// Arrival is when the request arrives, in nanoseconds from the
	// trace's start.
	Arrival int64
	// Class is the class header the request carries ("" = none).
	Class string
	// Tenant is the tenant key the request carries ("" = none).
	Tenant string
	// PromptTokens and OutputTokens are the request's sizes (>= 1).
	PromptTokens, OutputTokens int
	// PrefixGroup names a group of requests whose prompts start alike:
	// the first PrefixTokens tokens (0: the whole prompt) of every prompt
	// of a group are the same. "" is a prompt of its own.
	PrefixGroup  string
	PrefixTokens int
	// Priority (soft, higher first) and Strict (tier) are the SPEC §3
	// hints; HasPriority says the request carried a priority.
	Priority    int32
	HasPriority bool
	Strict      uint32
	// Adapter is the LoRA adapter the request's model names ("" = the
	// base model).
	Adapter string

	tokens []uint32 // a text prompt's token ids
	// hashIDs are a Mooncake line's block ids, one per idBlock tokens
	// (mooncake.go).
	hashIDs []uint32
	idBlock int
}

// Trace is the requests of one run, in trace order (the order of the
// file, which is the order of requests.jsonl), and their arrival order.
type Trace struct {
	Requests []Request
	// Source says where the trace came from (file or generate spec).
	Source string
	// byArrival lists the indexes of Requests by arrival, ties in trace
	// order.
	byArrival []int32
	// cacheable is set when any request can share a prefix with another
	// (a prefix group, a text prompt or hash ids).
	cacheable bool
	// origin is the wall-clock time (Unix nanoseconds) of arrival 0 when
	// the format has one (Azure); merged traces align on it (traceopts.go).
	origin    int64
	hasOrigin bool
}

// finish validates the requests and indexes them by arrival.
func (t *Trace) finish() error {
	if len(t.Requests) == 0 {
		return fmt.Errorf("trace %s has no requests", t.Source)
	}
	if len(t.Requests) > math.MaxInt32 {
		return fmt.Errorf("trace %s has %d requests, at most %d", t.Source, len(t.Requests), math.MaxInt32)
	}
	t.byArrival = make([]int32, len(t.Requests))
	sorted := true
	for i := range t.Requests {
		r := &t.Requests[i]
		if r.PromptTokens < 1 || r.OutputTokens < 1 {
			return fmt.Errorf("trace %s: request %d: prompt_tokens %d and output_tokens %d must be at least 1", t.Source, i, r.PromptTokens, r.OutputTokens)
		}
		if r.Arrival < 0 {
			return fmt.Errorf("trace %s: request %d: negative arrival", t.Source, i)
		}
		if r.PrefixGroup != "" || r.tokens != nil || r.hashIDs != nil {
			t.cacheable = true
		}
		t.byArrival[i] = int32(i)
		if i > 0 && r.Arrival < t.Requests[i-1].Arrival {
			sorted = false
		}
	}
	if !sorted {
		slices.SortStableFunc(t.byArrival, func(a, b int32) int {
			return cmp.Compare(t.Requests[a].Arrival, t.Requests[b].Arrival)
		})
	}
	return nil
}

// Span is the time from the first arrival to the last.
func (t *Trace) Span() time.Duration {
	first := t.Requests[t.byArrival[0]].Arrival
	last := t.Requests[t.byArrival[len(t.byArrival)-1]].Arrival
	return time.Duration(last - first)
}

// Tenants reports whether any request names a tenant.
func (t *Trace) Tenants() bool {
	for i := range t.Requests {
		if t.Requests[i].Tenant != "" {
			return true
		}
	}
	return false
}

// ReadTraceFile reads a trace: Laneway JSONL (.jsonl, .json, .ndjson) or
// an Azure LLM inference trace (.csv).
func ReadTraceFile(path string) (*Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read trace: %w", err)
	}
	defer f.Close()
	var t *Trace
	switch strings.ToLower(filepath.Ext(path)) {
	case ".csv":
		t, err = ReadAzureCSV(f, path)
	default:
		t, err = ReadJSONL(f, path)
	}
	if err != nil {
		return nil, err
	}
	return t, nil
}

// jsonlLine is one line of a Laneway JSONL trace.
type jsonlLine struct {
	ArrivalMS      *float64 `json:"arrival_ms"`
	Class          string   `json:"class"`
	Tenant         string   `json:"tenant"`
	PromptTokens   *int     `json:"prompt_tokens"`
	Prompt         *string  `json:"prompt"`
	OutputTokens   *int     `json:"output_tokens"`
	PrefixGroup    string   `json:"prefix_group"`
	PrefixTokens   int      `json:"prefix_tokens"`
	Priority       *int32   `json:"priority"`
	StrictPriority uint32   `json:"strict_priority"`
	Adapter        string   `json:"adapter"`
}

// ReadJSONL reads a Laneway JSONL trace: one JSON object per line with
// arrival_ms and prompt_tokens (or prompt, a text whose tokens are
// estimated by pkg/tokenize), and optionally class, tenant,
// output_tokens (default 16), prefix_group, prefix_tokens, priority,
// strict_priority and adapter (the LoRA adapter the model names). Unknown fields are an error; blank lines are skipped.
func ReadJSONL(r io.Reader, name string) (*Trace, error) {
	t := &Trace{Source: name}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), 64<<20)
	for lineNo := 1; sc.Scan(); lineNo++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var l jsonlLine
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil {
			return nil, fmt.Errorf("trace %s line %d: %w", name, lineNo, err)
		}
		req, err := l.request()
		if err != nil {
			return nil, fmt.Errorf("trace %s line %d: %w", name, lineNo, err)
		}
		t.Requests = append(t.Requests, req)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("trace %s: %w", name, err)
	}
	if err := t.finish(); err != nil {
		return nil, err
	}
	return t, nil
}

func (l *jsonlLine) request() (Request, error) {
	var r Request
	if l.ArrivalMS == nil {
		return r, errors.New("arrival_ms is required")
	}
	if *l.ArrivalMS < 0 || math.IsNaN(*l.ArrivalMS) || math.IsInf(*l.ArrivalMS, 0) {
		return r, fmt.Errorf("arrival_ms %v: want a finite number >= 0", *l.ArrivalMS)
	}
	r.Arrival = int64(math.Round(*l.ArrivalMS * 1e6))
	r.Class, r.Tenant, r.Adapter = l.Class, l.Tenant, l.Adapter
	switch {
	case l.Prompt != nil:
		r.tokens = tokenize.Tokenize(nil, *l.Prompt)
		r.PromptTokens = len(r.tokens)
		if l.PromptTokens != nil && *l.PromptTokens != r.PromptTokens {
			return r, fmt.Errorf("prompt_tokens %d, but the prompt has %d tokens", *l.PromptTokens, r.PromptTokens)
		}
	case l.PromptTokens != nil:
		r.PromptTokens = *l.PromptTokens
	default:
		return r, errors.New("prompt_tokens (or prompt) is required")
	}
	if r.PromptTokens < 1 {
		return r, fmt.Errorf("prompt_tokens %d: want >= 1", r.PromptTokens)
	}
	r.OutputTokens = DefaultOutputTokens
	if l.OutputTokens != nil {
		r.OutputTokens = *l.OutputTokens
	}
	if r.OutputTokens < 1 {
		return r, fmt.Errorf("output_tokens %d: want >= 1", r.OutputTokens)
	}
	r.PrefixGroup, r.PrefixTokens = l.PrefixGroup, l.PrefixTokens
	if r.PrefixTokens < 0 || (r.PrefixTokens > 0 && r.PrefixGroup == "") {
		return r, fmt.Errorf("prefix_tokens %d: want >= 0, and a prefix_group", r.PrefixTokens)
	}
	if l.Priority != nil {
		r.Priority, r.HasPriority = *l.Priority, true
	}
	r.Strict = l.StrictPriority
	return r, nil
}

// azureTimeLayouts are the timestamp forms of the public Azure LLM
// inference traces ("2023-11-16 18:15:46.6805900") and their ISO cousins.
var azureTimeLayouts = []string{
	"2006-01-02 15:04:05.999999999",
	"2006-01-02 15:04:05.999999999Z07:00",
	"2006-01-02T15:04:05.999999999",
	"2006-01-02T15:04:05.999999999Z07:00",
	"2006-01-02 15:04:05.999999999 -0700 MST",
}

// parseAzureTime reads a TIMESTAMP cell: seconds (a number) or a datetime;
// it returns nanoseconds on some fixed origin.
func parseAzureTime(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if v, err := strconv.ParseFloat(s, 64); err == nil {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return 0, fmt.Errorf("timestamp %q is not finite", s)
		}
		return int64(math.Round(v * 1e9)), nil
	}
	for _, l := range azureTimeLayouts {
		if ts, err := time.Parse(l, s); err == nil {
			return ts.UnixNano(), nil
		}
	}
	return 0, fmt.Errorf("timestamp %q: want seconds or a datetime like 2023-11-16 18:15:46.6805900", s)
}

// ReadAzureCSV reads the column format of the public Azure LLM inference
// traces: a header naming TIMESTAMP, ContextTokens and GeneratedTokens (any
// order, any case, other columns ignored), then one row per request.
// Arrivals are relative to the earliest timestamp. Requests carry no class
// or tenant: the assignment rules give them one. A GeneratedTokens of 0
// counts as 1 (the request still produces its first token).
func ReadAzureCSV(r io.Reader, name string) (*Trace, error) {
	cr := csv.NewReader(r)
	cr.ReuseRecord = true
	cr.FieldsPerRecord = -1
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("trace %s: header: %w", name, err)
	}
	col := map[string]int{"timestamp": -1, "contexttokens": -1, "generatedtokens": -1}
	for i, h := range head {
		k := strings.ToLower(strings.TrimSpace(strings.TrimPrefix(h, "\ufeff")))
		if _, ok := col[k]; ok {
			col[k] = i
		}
	}
	for _, k := range []string{"timestamp", "contexttokens", "generatedtokens"} {
		if col[k] < 0 {
			return nil, fmt.Errorf("trace %s: the header %q lacks a column %s (want TIMESTAMP,ContextTokens,GeneratedTokens)", name, strings.Join(head, ","), k)
		}
	}
	t := &Trace{Source: name}
	var stamps []int64
	for row := 2; ; row++ {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("trace %s row %d: %w", name, row, err)
		}
		cell := func(k string) (string, error) {
			if i := col[k]; i < len(rec) {
				return rec[i], nil
			}
			return "", fmt.Errorf("trace %s row %d: no %s cell", name, row, k)
		}
		ts, err := cell("timestamp")
		if err != nil {
			return nil, err
		}
		at, err := parseAzureTime(ts)
		if err != nil {
			return nil, fmt.Errorf("trace %s row %d: %w", name, row, err)
		}
		var n [2]int
		for j, k := range []string{"contexttokens", "generatedtokens"} {
			v, err := cell(k)
			if err != nil {
				return nil, err
			}
			if n[j], err = strconv.Atoi(strings.TrimSpace(v)); err != nil || n[j] < 0 {
				return nil, fmt.Errorf("trace %s row %d: %s %q: want a count >= 0", name, row, k, v)
			}
		}
		stamps = append(stamps, at)
		t.Requests = append(t.Requests, Request{PromptTokens: max(n[0], 1), OutputTokens: max(n[1], 1)})
	}
	if len(stamps) > 0 {
		origin := slices.Min(stamps)
		for i := range t.Requests {
			t.Requests[i].Arrival = stamps[i] - origin
		}
		t.origin, t.hasOrigin = origin, true
	}
	if err := t.finish(); err != nil {
		return nil, err
	}
	return t, nil
}
