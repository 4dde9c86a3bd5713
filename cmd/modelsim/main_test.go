package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestRunRejectsBadInput(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"--no-such-flag"}, "unknown flag"},
		{"invalid config", []string{"--host", "127.0.0.26", "--port", "0", "--max-num-seqs", "0"}, "--max-num-seqs"},
		{"bad policy", []string{"--host", "127.0.0.26", "--port", "0", "--scheduling-policy", "lifo"}, "scheduling-policy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := run(context.Background(), tt.args)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("run(%q) = %v, want an error mentioning %q", tt.args, err, tt.want)
			}
		})
	}
}

// TestRunServesAndStops runs the command's entry point on a loopback port
// and stops it through its context, as SIGTERM does.
func TestRunServesAndStops(t *testing.T) {
	// Find a free port on a loopback address of our own.
	ln, err := net.Listen("tcp", "127.0.0.26:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--host", "127.0.0.26", "--port", strconv.Itoa(port), "--instance", "sim-x", "--model", "m", "-v", "0"})
	}()
	base := "http://127.0.0.26:" + strconv.Itoa(port)
	deadline := time.Now().Add(10 * time.Second)
	var resp *http.Response
	for {
		// The listener appears without an event we can wait on; poll.
		if resp, err = http.Get(base + "/v1/models"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("server did not come up: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.Header.Get("x-modelsim-instance") != "sim-x" || !strings.Contains(string(body), `"id":"m"`) {
		t.Fatalf("GET /v1/models: header %q body %s", resp.Header.Get("x-modelsim-instance"), body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}
