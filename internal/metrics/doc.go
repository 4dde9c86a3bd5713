// Package metrics exposes the endpoint picker's Prometheus series (SPEC
// §10): the reference router's queue gauges and backpressure counter under
// their original names, so existing dashboards keep working, and Laneway's
// own laneway_* series.
//
// Queue depth, deficits and endpoint load are read from a dispatcher
// snapshot at scrape time rather than updated per request, so the request
// path pays only for the counters and the wait histogram.
package metrics
