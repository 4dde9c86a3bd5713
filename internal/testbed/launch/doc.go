// Package launch is the one way the module's suites, the demo and the load
// tool run Laneway's own binaries as real processes: it builds cmd/epp,
// cmd/modelsim and cmd/gateway, starts them on loopback with their output
// captured, awaits them (the picker's serving line and readiness service,
// the simulator's /health, the gateway's serving line), scrapes their
// Prometheus pages, and stops them with SIGTERM, falling back to a
// goroutine dump and a kill.
//
// Layers, one file group each:
//
//   - Any process (proc.go, log.go, ready.go, ports.go, build.go): Start,
//     Proc, Log, readiness checks (Poll, WaitGRPCServing), free ports, go
//     build. The load tool starts the upstream reference picker and its
//     floor server through these.
//   - The module's commands (picker.go, sim.go, gateway.go): Binaries
//     says where they are; StartEPP, StartSim and StartGateway take an
//     options struct with the flags callers set and return once the
//     process serves, with the addresses it bound. The picker and the
//     gateway listen on ports the kernel picks and log them, so no
//     probed port can be taken between probe and bind.
//   - Tests (wait.go, metrics.go, leak.go, and the Run* forms):
//     BuildAndRun is a suite's TestMain; RunEPP, RunSim and RunGateway
//     start for a test and judge the exit at its cleanup; WaitFor is the
//     one polling wait with a deadline, Proc.WaitLog the wait for a log
//     line; Metrics and Page read a series by name and labels (the demo
//     and the load tool read theirs with them too); RunLaneway and
//     ReadStatus (cli.go) run the operator CLI and read a picker's status
//     page through it; CheckGoroutines is the leak check.
//
// It absorbed what was internal/testproc. The process layer alone did not
// stop each suite from growing its own picker launcher, wait, scrape and
// port helpers on top of it, three times over with different argument
// orders and meanings; with both layers in one package, the helper a test
// needs is where the process it starts comes from.
//
// The package does not import testing (TB is the subset of testing.TB it
// uses), so commands link it without the test framework. Each caller keeps
// its own policy for what is specific to it: which flags, which exits it
// expects (Proc.ExpectFailure), which logs it awaits.
package launch
