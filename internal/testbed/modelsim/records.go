package modelsim

import (
	"sync"
	"time"
)

// Record is one ended request as /debug/requests shows it. It carries no
// prompt text.
type Record struct {
	// ID, Priority, LoRA, PromptTokens and MaxTokens are the request's
	// (see Seq).
	ID           uint64 `json:"id"`
	Priority     int    `json:"priority"`
	LoRA         string `json:"lora,omitempty"`
	PromptTokens int    `json:"prompt_tokens"`
	MaxTokens    int    `json:"max_tokens"`
	// CachedTokens is the prefix-cache hit at admission (with the
	// transferred prompt of a disaggregated request).
	CachedTokens int `json:"cached_tokens"`
	// RequestID is the request's x-request-id header, if any: it ties the
	// two records of a disaggregated request together.
	RequestID string `json:"request_id,omitempty"`
	// PrefilledBy is, on a decode pod, the prefill pod ("host:port") that
	// prefilled the request before its KV cache was transferred here.
	PrefilledBy string `json:"prefilled_by,omitempty"`
	// RemoteDecode marks, on a prefill pod, a request prefilled for a
	// decode pod (kv_transfer_params.do_remote_decode).
	RemoteDecode bool `json:"remote_decode,omitempty"`
	// Generated is the number of tokens produced.
	Generated int `json:"completion_tokens"`
	// Outcome is "length" (all max_tokens generated) or "abort".
	Outcome string `json:"outcome"`
	// Arrival, Start (admitted to a slot), FirstToken and Finish are the
	// request's timeline; Start and FirstToken are zero if never reached.
	Arrival    time.Time `json:"arrival"`
	Start      time.Time `json:"start,omitzero"`
	FirstToken time.Time `json:"first_token,omitzero"`
	Finish     time.Time `json:"finish"`
}

func recordOf(s *Seq, outcome string) Record {
	return Record{
		ID: s.ID, Priority: s.Priority, LoRA: s.LoRA,
		PromptTokens: s.PromptTokens, CachedTokens: s.cachedTokens,
		RequestID: s.RequestID, PrefilledBy: s.PrefilledBy, RemoteDecode: s.RemoteDecode,
		MaxTokens: s.MaxTokens, Generated: int(s.progress.Load()), Outcome: outcome,
		Arrival: s.Arrival, Start: s.start, FirstToken: s.firstToken, Finish: s.finish,
	}
}

// recordRing keeps the last records in order of ending.
type recordRing struct {
	mu   sync.Mutex
	buf  []Record
	next int
	full bool
}

func newRecordRing(n int) *recordRing { return &recordRing{buf: make([]Record, n)} }

func (r *recordRing) add(rec Record) {
	if len(r.buf) == 0 {
		return
	}
	r.mu.Lock()
	r.buf[r.next] = rec
	r.next++
	if r.next == len(r.buf) {
		r.next, r.full = 0, true
	}
	r.mu.Unlock()
}

// last returns up to n records, oldest first.
func (r *recordRing) last(n int) []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	var all []Record
	if r.full {
		all = append(all, r.buf[r.next:]...)
	}
	all = append(all, r.buf[:r.next]...)
	if n >= 0 && n < len(all) {
		all = all[len(all)-n:]
	}
	return all
}
