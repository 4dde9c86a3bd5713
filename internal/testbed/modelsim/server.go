package modelsim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/laneway-dev/laneway/pkg/tokenize"
)

// InstanceHeader names the simulator instance on every response, so a test
// behind a picker can tell which endpoint served a request.
const InstanceHeader = "x-modelsim-instance"

// Limits and defaults of the HTTP side.
const (
	maxBodyBytes     = 64 << 20
	defaultMaxTokens = 16
	shutdownGrace    = 10 * time.Second
)

// Server is the simulator's HTTP front end around an Engine.
type Server struct {
	cfg      Config
	log      logr.Logger
	m        *metrics
	engine   *Engine
	records  *recordRing
	adapters map[string]bool // LoRA adapter names
	instance string
	created  int64
	// prefillClient is the decode sidecar's client to prefill pods (pd.go).
	prefillClient *http.Client

	// hold, while non-nil, is a gate new completions wait at before they
	// reach the engine (POST /debug/hold, /debug/release).
	holdMu sync.Mutex
	hold   chan struct{}
	held   int // completions waiting at hold
}

// New validates cfg and builds a server; start it with Serve.
func New(cfg Config, log logr.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("modelsim config: %w", err)
	}
	s := &Server{cfg: cfg, log: log, records: newRecordRing(cfg.DebugRecords),
		adapters: map[string]bool{}, instance: cfg.Instance, created: time.Now().Unix(),
		prefillClient: newPrefillClient()}
	for _, a := range cfg.LoRAAdapters {
		if a == cfg.Model {
			return nil, fmt.Errorf("modelsim config: --lora-modules %q repeats --model", a)
		}
		s.adapters[a] = true
	}
	var e *Engine
	s.m = newMetrics(cfg,
		func() float64 { return float64(e.waitingN.Load()) },
		func() float64 { return float64(e.runningN.Load()) })
	e = newEngine(cfg, s.m, s.records)
	s.engine = e
	return s, nil
}

// Engine returns the engine, for tests that read its counters.
func (s *Server) Engine() *Engine { return s.engine }

// Instance is the name in the x-modelsim-instance header.
func (s *Server) Instance() string { return s.instance }

// Serve runs the engine and serves HTTP/1.1 on ln until ctx ends, then shuts
// down gracefully: it stops accepting, lets running requests finish for up
// to 10 s, and aborts the rest.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if s.instance == "" {
		s.instance = ln.Addr().String()
	}
	engCtx, stopEngine := context.WithCancel(context.Background())
	engDone := make(chan struct{})
	go func() {
		s.engine.run(engCtx)
		close(engDone)
	}()
	defer func() {
		stopEngine()
		<-engDone
	}()
	srv := &http.Server{Handler: s.handler(), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("modelsim serve %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	shCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(shCtx); err != nil {
		// Abort what is left so its handlers return, then close.
		stopEngine()
		<-engDone
		_ = srv.Close()
	}
	<-errc
	return nil
}

// handler returns the HTTP routes; they need the engine that Serve runs.
func (s *Server) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", s.completions(false))
	mux.HandleFunc("POST /v1/chat/completions", s.completions(true))
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /debug/requests", s.debugRequests)
	mux.HandleFunc("POST /debug/hold", s.setHold(true))
	mux.HandleFunc("POST /debug/release", s.setHold(false))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(InstanceHeader, s.instance)
		mux.ServeHTTP(w, r)
	})
}

// apiError writes an error in the OpenAI shape vLLM uses.
func apiError(w http.ResponseWriter, code int, msg string) {
	typ := map[int]string{
		http.StatusBadRequest:            "BadRequestError",
		http.StatusNotFound:              "NotFoundError",
		http.StatusBadGateway:            "BadGatewayError",
		http.StatusRequestEntityTooLarge: "BadRequestError",
		http.StatusServiceUnavailable:    "ServiceUnavailableError",
	}[code]
	if typ == "" {
		typ = "InternalServerError"
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"message": msg, "type": typ, "param": nil, "code": code,
	}})
}

// params are the request fields the simulator uses besides the prompt.
type params struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            json.RawMessage `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Priority int `json:"priority"`
	// KVTransferParams marks a prefill for a remote decode (pd.go).
	KVTransferParams *kvTransferParams `json:"kv_transfer_params"`
}

// present reports whether a raw field was given and is not null.
func present(raw json.RawMessage) bool { return len(raw) > 0 && !bytes.Equal(raw, []byte("null")) }

// setHold is POST /debug/hold and /debug/release: test tooling that lets a
// client release a workload together. While held, new completions are
// accepted but wait before they reach the engine, so the requests a
// picker sends first never finish their prefill and it keeps the rest
// queued; release lets every waiting completion in at once. Holding twice
// or releasing twice is harmless.
func (s *Server) setHold(on bool) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		s.holdMu.Lock()
		switch {
		case on && s.hold == nil:
			s.hold = make(chan struct{})
		case !on && s.hold != nil:
			close(s.hold)
			s.hold = nil
		}
		s.holdMu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}
}

// waitHold blocks while completions are held, or until the client goes.
func (s *Server) waitHold(ctx context.Context) error {
	s.holdMu.Lock()
	gate := s.hold
	if gate != nil {
		s.held++
	}
	s.holdMu.Unlock()
	if gate == nil {
		return nil
	}
	defer func() {
		s.holdMu.Lock()
		s.held--
		s.holdMu.Unlock()
	}()
	select {
	case <-gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// heldCount is how many completions wait at the hold now (tests).
func (s *Server) heldCount() int {
	s.holdMu.Lock()
	defer s.holdMu.Unlock()
	return s.held
}

func (s *Server) completions(chat bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.waitHold(r.Context()) != nil {
			return // the client went away while held
		}
		arrival := time.Now()
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
		if err != nil {
			if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
				apiError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body exceeds %d bytes", maxBodyBytes))
				return
			}
			apiError(w, http.StatusBadRequest, "reading request body: "+err.Error())
			return
		}
		var p params
		if err := json.Unmarshal(body, &p); err != nil {
			apiError(w, http.StatusBadRequest, "invalid request body: "+err.Error())
			return
		}
		switch {
		case chat && !present(p.Messages):
			apiError(w, http.StatusBadRequest, "messages: field required")
			return
		case !chat && !present(p.Prompt):
			apiError(w, http.StatusBadRequest, "prompt: field required")
			return
		}
		tokens, err := tokenize.ExtractPrompt(nil, body)
		if err != nil {
			apiError(w, http.StatusBadRequest, err.Error())
			return
		}
		model := p.Model
		if model == "" {
			model = s.cfg.Model
		}
		lora := ""
		if model != s.cfg.Model {
			if !s.adapters[model] {
				apiError(w, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", model))
				return
			}
			lora = model
		}
		maxTokens := defaultMaxTokens
		if p.MaxTokens != nil {
			maxTokens = *p.MaxTokens
		} else if chat && p.MaxCompletionTokens != nil {
			maxTokens = *p.MaxCompletionTokens
		}
		switch {
		case maxTokens < 1:
			apiError(w, http.StatusBadRequest, fmt.Sprintf("max_tokens must be at least 1, got %d.", maxTokens))
			return
		case p.Priority != 0 && s.cfg.SchedulingPolicy != PolicyPriority:
			apiError(w, http.StatusBadRequest, fmt.Sprintf("Got priority %d but Priority scheduling is not enabled.", p.Priority))
			return
		case len(tokens) == 0:
			apiError(w, http.StatusBadRequest, "The prompt cannot be empty.")
			return
		case len(tokens)+maxTokens > s.cfg.MaxModelLen:
			apiError(w, http.StatusBadRequest, fmt.Sprintf(
				"This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the prompt, %d in the completion). Please reduce the length of the prompt or completion.",
				s.cfg.MaxModelLen, len(tokens)+maxTokens, len(tokens), maxTokens))
			return
		}
		sub := Request{Tokens: tokens, MaxTokens: maxTokens, Priority: p.Priority, LoRA: lora, Arrival: arrival,
			RequestID: r.Header.Get(RequestIDHeader), RemoteDecode: p.KVTransferParams != nil && p.KVTransferParams.DoRemoteDecode}
		if host := r.Header.Get(PrefillerHeader); host != "" && s.cfg.Role != RolePrefill {
			// The decode sidecar: prefill there, pull the KV cache, decode
			// here. This server's part starts once the cache is here.
			if err := s.prefillRemotely(r.Context(), host, r.URL.Path, body, r.Header); err != nil {
				if r.Context().Err() != nil {
					return // the client went away
				}
				s.m.remotePrefills.WithLabelValues("error").Inc()
				apiError(w, http.StatusBadGateway, "disaggregated prefill failed: "+err.Error())
				return
			}
			s.m.remotePrefills.WithLabelValues("ok").Inc()
			sub.Transferred, sub.PrefilledBy, sub.Arrival = len(tokens), host, time.Now()
		}
		seq, ok := s.engine.Submit(sub)
		if !ok {
			apiError(w, http.StatusServiceUnavailable, "the server is shutting down")
			return
		}
		// Level 4: per request. Never the prompt text.
		s.log.V(4).Info("request", "id", seq.ID, "chat", chat, "model", model, "priority", p.Priority,
			"promptTokens", len(tokens), "maxTokens", maxTokens, "stream", p.Stream)
		rs := &response{s: s, seq: seq, chat: chat, model: model, created: time.Now().Unix(),
			includeUsage: p.StreamOptions != nil && p.StreamOptions.IncludeUsage}
		if p.Stream {
			rs.stream(w, r.Context())
		} else {
			rs.whole(w, r.Context())
		}
	}
}

// response writes one request's answer as its tokens appear.
type response struct {
	s            *Server
	seq          *Seq
	chat         bool
	model        string
	created      int64
	includeUsage bool
}

// wait blocks until the request has more than have tokens or has ended; it
// aborts the request when ctx ends first.
func (rs *response) wait(ctx context.Context, have int) (gen int, finished, aborted bool) {
	for {
		// State first: Generated is stored before the final state, so a
		// finished request reads its final count here.
		finished, aborted = rs.seq.State()
		gen = rs.seq.Generated()
		if gen > have || finished || aborted {
			return gen, finished, aborted
		}
		select {
		case <-rs.seq.Changed():
		case <-ctx.Done():
			rs.s.engine.Abort(rs.seq)
			return gen, false, true
		}
	}
}

// fillerWords make up the generated text, deterministically.
var fillerWords = []string{" The", " simulated", " model", " writes", " tokens", " at", " a", " steady", " pace", "."}

func word(i int) string { return fillerWords[i%len(fillerWords)] }

func (rs *response) id() string {
	if rs.chat {
		return "chatcmpl-" + strconv.FormatUint(rs.seq.ID, 10)
	}
	return "cmpl-" + strconv.FormatUint(rs.seq.ID, 10)
}

// usage is the response's usage object, with OpenAI's
// prompt_tokens_details.cached_tokens: the prefix-cache hit at admission
// (valid once a token has been generated, as it has when usage is sent).
func (rs *response) usage() map[string]any {
	n := rs.seq.Generated()
	return map[string]any{"prompt_tokens": rs.seq.PromptTokens, "completion_tokens": n,
		"total_tokens":          rs.seq.PromptTokens + n,
		"prompt_tokens_details": map[string]int{"cached_tokens": rs.seq.CachedTokens()}}
}

func (rs *response) whole(w http.ResponseWriter, ctx context.Context) {
	n := 0
	for {
		gen, finished, aborted := rs.wait(ctx, n)
		n = gen
		if finished {
			break
		}
		if aborted {
			if ctx.Err() == nil {
				apiError(w, http.StatusServiceUnavailable, "the request was aborted: the server is shutting down")
			}
			return // else the client is gone and the engine was told
		}
	}
	var text strings.Builder
	for i := range n {
		text.WriteString(word(i))
	}
	choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": "length", "stop_reason": nil}
	obj := "text_completion"
	if rs.chat {
		obj = "chat.completion"
		choice["message"] = map[string]any{"role": "assistant", "content": text.String()}
	} else {
		choice["text"] = text.String()
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"id": rs.id(), "object": obj, "created": rs.created, "model": rs.model,
		"choices": []any{choice}, "usage": rs.usage(),
	})
}

// stream writes server-sent events: one chunk per token (the first right
// after prefill), a usage chunk when stream_options.include_usage is set, and
// "data: [DONE]".
func (rs *response) stream(w http.ResponseWriter, ctx context.Context) {
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	// Headers go out at once, as vLLM's streaming responses do: a gateway
	// sees the response start while the request still waits or prefills,
	// and only the first data chunk marks the first token.
	if flusher != nil {
		flusher.Flush()
	}
	obj := "text_completion"
	if rs.chat {
		obj = "chat.completion.chunk"
	}
	event := func(choices []any, usage map[string]any) {
		m := map[string]any{"id": rs.id(), "object": obj, "created": rs.created, "model": rs.model, "choices": choices}
		if usage != nil {
			m["usage"] = usage
		}
		b, _ := json.Marshal(m)
		_, _ = fmt.Fprintf(w, "data: %s\n\n", b)
	}
	have := 0
	for {
		n, finished, aborted := rs.wait(ctx, have)
		if have == 0 && n > 0 && rs.chat {
			event([]any{map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""},
				"logprobs": nil, "finish_reason": nil}}, nil)
		}
		for i := have; i < n; i++ {
			var finish any
			if finished && i == n-1 {
				finish = "length"
			}
			c := map[string]any{"index": 0, "logprobs": nil, "finish_reason": finish}
			if rs.chat {
				c["delta"] = map[string]any{"content": word(i)}
			} else {
				c["text"] = word(i)
			}
			event([]any{c}, nil)
		}
		have = n
		switch {
		case finished:
			if rs.includeUsage {
				event([]any{}, rs.usage())
			}
			_, _ = io.WriteString(w, "data: [DONE]\n\n")
		case aborted && ctx.Err() == nil:
			b, _ := json.Marshal(map[string]any{"error": map[string]any{
				"message": "the request was aborted: the server is shutting down", "type": "ServiceUnavailableError", "code": 503}})
			_, _ = fmt.Fprintf(w, "data: %s\n\n", b)
		}
		if flusher != nil {
			flusher.Flush()
		}
		if finished || aborted {
			return
		}
	}
}

func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	entry := func(id, parent string) map[string]any {
		m := map[string]any{"id": id, "object": "model", "created": s.created, "owned_by": "vllm",
			"root": id, "parent": nil, "max_model_len": s.cfg.MaxModelLen}
		if parent != "" {
			m["parent"] = parent
		}
		return m
	}
	data := []any{entry(s.cfg.Model, "")}
	for _, a := range s.cfg.LoRAAdapters {
		data = append(data, entry(a, s.cfg.Model))
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
}

// DebugRequests is the body of GET /debug/requests.
type DebugRequests struct {
	// Instance is the x-modelsim-instance name.
	Instance string `json:"instance"`
	// Role is the server's --role.
	Role string `json:"role"`
	// MaxRunning is the most requests that ever ran at once.
	MaxRunning int `json:"max_running"`
	// Records are the last ended requests, oldest first (?n= keeps the
	// last n).
	Records []Record `json:"records"`
}

func (s *Server) debugRequests(w http.ResponseWriter, r *http.Request) {
	n := -1
	if v := r.URL.Query().Get("n"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 0 {
			apiError(w, http.StatusBadRequest, fmt.Sprintf("n=%q: want a non-negative integer", v))
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(DebugRequests{Instance: s.instance, Role: s.cfg.Role, MaxRunning: s.engine.MaxRunning(), Records: s.records.last(n)})
}
