// Package integration drives the real endpoint picker binary (cmd/epp) end to
// end: TestMain builds it once, each test starts it as a subprocess on free
// loopback ports, plays Envoy's side of ext_proc with internal/testbed/extprocclient,
// and checks what a gateway and its clients would observe — picks, immediate
// responses, queue order, metrics, reloads and shutdown — against real HTTP
// backends on 127.0.0.x addresses. The header-only suites also run the
// local gateway (cmd/gateway) and the model-server simulator
// (cmd/modelsim) as processes, the gateway playing clients that send no
// response phase.
//
// The package holds only tests; this file exists so the package has a
// non-test file stating its job.
package integration
