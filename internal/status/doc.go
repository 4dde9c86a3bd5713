// Package status is the picker's live view of its queues for people and
// scripts (SPEC §14): what each class holds, who is waiting, who was served
// in the last minute and how fairly, and the endpoints' load. It serves
// the JSON of /debug/status on a listener of its own (--status-port, on
// the loopback address by default: it names tenants and endpoint
// addresses), which `laneway status` reads, and the two gauges derived from the same window
// (laneway_tenant_fairness_jain).
//
// Tenants never become Prometheus labels (their number is unbounded); they
// appear here, the top few per class. The Tracker keeps one minute of
// decisions as per-second buckets per class: O(distinct tenants served per
// second) memory each, so a minute of 3,000 requests/s from 10 tenants is
// a few thousand map entries, not 180,000 records. The dispatcher's loop
// writes the window (Decided) under a lock that readers (the page, the
// /metrics gauge, retry-after estimates) hold only to take a snapshot: the
// current second's copy and pointers to the others, which are never
// written again; they sum up outside it.
package status
