package epp

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr"
)

// TestBoundScrapes: with n requests inside the handler the next one is
// answered 503 with Retry-After without reaching it, and a slot freed by
// a finished request serves again.
func TestBoundScrapes(t *testing.T) {
	const n = 2
	entered, release := make(chan struct{}), make(chan struct{})
	var calls int
	var mu sync.Mutex
	h := boundScrapes(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls++
		mu.Unlock()
		if r.URL.Path == "/slow" {
			entered <- struct{}{}
			<-release
		}
		w.WriteHeader(http.StatusOK)
	}), n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/slow", nil))
		}()
		<-entered
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/fast", nil))
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "1" {
		t.Errorf("request over the bound: %d retry-after %q, want 503 with Retry-After 1", rec.Code, rec.Header().Get("Retry-After"))
	}
	mu.Lock()
	if calls != n {
		t.Errorf("handler called %d times, want %d: the refused request reached it", calls, n)
	}
	mu.Unlock()
	close(release)
	wg.Wait()
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/fast", nil))
	if rec.Code != http.StatusOK {
		t.Errorf("request after the slow ones finished: %d, want 200", rec.Code)
	}
}

// TestTLSOptions: --client-ca needs TLS, and a bundle that cannot be
// loaded fails the start naming the flag.
func TestTLSOptions(t *testing.T) {
	check := func(o *Options) error { // as cmd/epp does: Complete, then Validate
		if err := o.Complete(); err != nil {
			return err
		}
		return o.Validate()
	}
	plain := testOptions(func(o *Options) { o.ClientCA = "ca.crt" })
	if err := check(plain); err == nil || !strings.Contains(err.Error(), "--client-ca ca.crt needs --secure-serving") {
		t.Errorf("Validate of --client-ca without TLS: %v", err)
	}
	missing := testOptions(func(o *Options) { o.SecureServing, o.ClientCA = true, t.TempDir()+"/missing.crt" })
	if err := check(missing); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if _, err := NewServer(missing, defaultPolicy(t), BodyParser{}, logr.Discard()); err == nil || !strings.Contains(err.Error(), "--client-ca") {
		t.Errorf("NewServer with a missing --client-ca bundle: %v, want an error naming --client-ca", err)
	}
	if o := NewOptions(); o.PprofBind != "127.0.0.1" {
		t.Errorf("default --pprof-bind %q, want the loopback address", o.PprofBind)
	}
}
