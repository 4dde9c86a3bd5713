package modelsim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// This file is the decode side of a disaggregated request, as llm-d's
// routing sidecar does it in front of a decode pod's vLLM: the picker names
// the prefill pod in x-prefiller-host-port; the sidecar sends it the
// request with max_tokens 1 and kv_transfer_params.do_remote_decode, waits
// for the answer, pulls the KV cache (KVTransferTime here), and decodes
// locally with the prompt already computed.

// PrefillerHeader names a disaggregated request's prefill pod, "host:port".
const PrefillerHeader = "x-prefiller-host-port"

// RequestIDHeader is recorded with each request and passed on to the
// prefill pod, so the two records of a disaggregated request match.
const RequestIDHeader = "x-request-id"

// maxPrefillAnswer bounds what the sidecar reads of the prefill pod's
// answer (one token's completion).
const maxPrefillAnswer = 1 << 20

// kvTransferParams is the part of vLLM's kv_transfer_params the simulator
// reads.
type kvTransferParams struct {
	DoRemoteDecode bool `json:"do_remote_decode"`
}

// prefillRemotely runs the prefill stage of a disaggregated request on
// host and waits for its KV cache to arrive. body is the client's request;
// the prefill pod gets it with max_tokens 1, not streamed.
func (s *Server) prefillRemotely(ctx context.Context, host, path string, body []byte, h http.Header) error {
	if _, _, err := net.SplitHostPort(host); err != nil {
		return fmt.Errorf("%s %q is not host:port", PrefillerHeader, host)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return err // not reached: the handler parsed it already
	}
	one := json.RawMessage("1")
	m["max_tokens"] = one
	if _, ok := m["max_completion_tokens"]; ok {
		m["max_completion_tokens"] = one
	}
	m["stream"] = json.RawMessage("false")
	delete(m, "stream_options")
	m["kv_transfer_params"] = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false}`)
	out, err := json.Marshal(m)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+host+path, bytes.NewReader(out))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if id := h.Get(RequestIDHeader); id != "" {
		req.Header.Set(RequestIDHeader, id)
	}
	resp, err := s.prefillClient.Do(req)
	if err != nil {
		return fmt.Errorf("prefill on %s: %w", host, err)
	}
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxPrefillAnswer))
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("prefill on %s: reading the answer: %w", host, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("prefill on %s: status %d: %s", host, resp.StatusCode, bytes.TrimSpace(answer))
	}
	if d := s.cfg.scale(s.cfg.KVTransferTime); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// scale divides a duration of the model by the speedup.
func (c *Config) scale(d time.Duration) time.Duration {
	return time.Duration(float64(d) / c.Speedup)
}

// newPrefillClient is the sidecar's client to prefill pods.
func newPrefillClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}}
}
