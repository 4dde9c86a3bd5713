// Package load generates ext_proc load against an endpoint picker and
// measures it the way SPEC §13 defines: decision latency (from sending a
// request's last body message to receiving the request-headers answer),
// decisions per second, errors, and the picker's CPU per 1,000 decisions.
//
// Three drivers:
//
//   - H2Runner.RunOpen is the open loop through h2client, an event-driven
//     HTTP/2 gateway with a few goroutines per connection, as Envoy's
//     workers are. It is cmd/loadgen's default for latency runs: on a
//     machine the load tool shares with the picker, a goroutine and a grpc-go
//     stream per request made the tool the biggest CPU user and its own GC
//     pauses part of the tail it measured.
//   - Runner.RunOpen is the same open loop through internal/testbed/extprocclient,
//     the full-featured gRPC client the integration suites use (--client
//     grpc): requests arrive on a fixed
//     schedule of Rate per second for Duration, whatever the picker does;
//     each routed request is held open for Hold before its response phases
//     are played back, so about Rate×Hold streams are open at once. An
//     arrival that would exceed ConcurrencyCap open streams is skipped and
//     counted, never delayed, so the schedule stays open-loop.
//   - Runner.RunClosed keeps N streams busy: each worker starts the next request as
//     soon as its previous one ends. It measures throughput; its latency is
//     N / throughput by Little's law and is labelled as closed-loop.
//
// Two references make a figure from a shared machine mean something:
//
//   - Result.Wire (h2 driver, Linux) times each decision to the kernel's
//     receive timestamp of the answer as well as to the reader handling it,
//     so the load tool's own wake-up can be told apart from the picker's.
//   - FloorProcessor is an ext_proc server that only answers, on the
//     picker's transport options: measured in the same minutes
//     (loadgen --compare-floor), Laneway's latency above it is what its own
//     work adds.
//
// Soak is the long run of `make soak` (cmd/loadgen --soak): the same open
// loop through h2client for up to a day, each request with a prompt of its
// own after a shared prefix, while the caller's actions change the
// picker's endpoints and policy on their own schedules. It counts every
// request's answers and ends by its arrival index (exactly once, or which
// way not), and samples the picker's RSS, heap and goroutines before,
// during and after.
//
// CPU samplers read a process's CPU time from /proc or from the picker's
// process_cpu_seconds_total metric. The picker of a self-contained run is
// started with internal/testbed/launch, as the suites start theirs; SpawnLWEPP
// starts the upstream reference picker with its own API server.
// cmd/loadgen is the command around this package. Every loop is bounded in
// count and time.
package load
