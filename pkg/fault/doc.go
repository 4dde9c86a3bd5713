// Package fault is the picker's fault-injection hook: At marks a point on
// the request path (the stream state machine of pkg/extproc, the Handler
// of internal/epp) where the suites may make handling one request panic,
// to show that the fault stays contained to its stream.
//
// Only a binary built with the lanewayfaults tag can panic there: At is an
// empty function otherwise (fault.go), and the code that reads the
// request header x-laneway-test-fault and panics when it names the point
// is compiled with the tag only (fault_lanewayfaults.go). No flag, header
// or environment can make a production build panic on purpose, and the
// hook costs it nothing (the empty call is inlined away).
//
// The points: "request_body" and "response_headers" (pkg/extproc),
// "decide" and "after_grant" (internal/epp).
package fault
