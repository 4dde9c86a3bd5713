// Package testproc runs the module's own binaries as real processes for
// test harnesses and demos: it builds a main package once, picks free
// loopback ports, starts a process with its output captured (and, on
// Linux, tied to the parent's life), waits for it to be ready (gRPC
// health, HTTP 200, TCP open) within a deadline and stops it with SIGTERM,
// falling back to a goroutine dump and a kill.
//
// It does not import testing, so non-test code (internal/demo, test/load)
// shares it with the _test suites; each suite keeps its own policy for
// what a failure means (which exits are expected, when logs are printed).
package testproc
