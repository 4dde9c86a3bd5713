// Command laneway is the operator's tool:
//
//	laneway validate FILE
//	laneway convert FILE --pool NAME [--namespace NS]
//	laneway status --epp HOST:PORT [--watch] [--output json]
//	laneway simulate (--trace FILE | --generate SPEC) [--policy FILE|none|round-robin]... [flags]
//
// validate loads a policy YAML file (the reference router's format) with
// the same strict loader and rules the picker uses; it prints one summary
// line per class and per tenant binding, then one line saying where tenant
// identity comes from (or that there is none and client hints are
// trusted), and exits 0, or prints every problem, one per line, and exits
// 1. convert prints the PolicyProfile (with the tenant rules) and
// PolicyClass objects that express the same policy for one InferencePool,
// as multi-document YAML for kubectl apply. status reads a running
// picker's status page (its --status-port, on the pod's loopback address:
// kubectl port-forward) and prints it as tables or JSON.
// simulate replays a trace through the picker's own scheduling core and
// simulated model servers in virtual time, for each policy and baseline,
// and writes a table, summary.json, requests.jsonl per policy and plots
// (internal/testbed/simulate, docs/simulate.md). Usage errors exit 2.
package main
