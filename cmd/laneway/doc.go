// Command laneway is the operator's policy tool:
//
//	laneway validate FILE
//	laneway convert FILE --pool NAME [--namespace NS]
//
// validate loads a policy YAML file (the reference router's format) with
// the same strict loader and rules the picker uses; it prints one summary
// line per class and per tenant binding, then one line saying where tenant
// identity comes from (or that there is none and client hints are
// trusted), and exits 0, or prints every problem, one per line, and exits
// 1. convert prints the PolicyProfile (with the tenant rules) and
// PolicyClass objects that express the same policy for one InferencePool,
// as multi-document YAML for kubectl apply. Usage errors exit 2.
package main
