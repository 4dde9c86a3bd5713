package epp

import (
	"net/http"
	"strconv"
)

// MaxConcurrentScrapes bounds the requests the metrics port (/metrics) and
// the status page's port (/debug/status) serve at once, together. Each one renders a page in memory whose
// size grows with the endpoints and classes (about 300 bytes per endpoint
// on each page), and a scraper that reads slowly keeps its copy alive: a
// handful of Prometheus replicas, a dashboard and `laneway status` fit
// under the bound, a stampede of them does not take the picker's memory
// or CPU from the requests it schedules. A constant rather than a flag:
// nothing legitimate scrapes one picker more than a few times at once.
const MaxConcurrentScrapes = 4

// scrapeRetryAfter is the Retry-After of a scrape refused at the bound,
// in seconds: pages render in milliseconds, so a slot frees soon.
const scrapeRetryAfter = 1

// boundScrapes serves at most n requests of h at once; one more is
// answered 503 with Retry-After at once rather than queued, so that the
// bound also caps the memory of waiting requests.
func boundScrapes(h http.Handler, n int) http.Handler {
	slots := make(chan struct{}, n)
	retry := strconv.Itoa(scrapeRetryAfter)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case slots <- struct{}{}:
		default:
			w.Header().Set("Retry-After", retry)
			http.Error(w, "too many concurrent scrapes of the endpoint picker; retry later", http.StatusServiceUnavailable)
			return
		}
		defer func() { <-slots }()
		h.ServeHTTP(w, r)
	})
}
