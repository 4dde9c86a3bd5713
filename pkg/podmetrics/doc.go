// Package podmetrics holds what the picker knows about each model-server
// pod's load. This file set is its parsing half: it reads a Prometheus text
// page (/metrics) of vLLM, SGLang or TensorRT-LLM serve into one
// engine-neutral Metrics value (SPEC §9).
//
// Parse scans the page once and decodes only the lines of the few series it
// uses, without building metric families, because the picker scrapes every
// pod several times a second and a full exposition parse would cost the
// request path CPU and garbage. Lines of other series are skipped after
// their name, so an unfamiliar series an engine adds cannot fail a scrape.
//
// A series missing from the page leaves its field unknown rather than zero:
// an unknown queue length must never make a pod look idle.
//
// The scraping half, Scraper, polls every endpoint's page on a goroutine of
// its own (outside the picker's dispatch loop) and hands each good scrape to
// a Sink. It owns staleness: an endpoint whose last good scrape started
// more than the staleness bound ago is reported stale by a timer, even while
// a hung scrape is still waiting for its timeout, and an endpoint never
// scraped successfully is unknown. The Sink must treat both as busy, never
// as idle (SPEC §9).
package podmetrics
