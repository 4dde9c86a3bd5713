// Package quality is the scheduling-quality benchmark of `make
// bench-quality` (minutes; not part of `make test`): scenarios that run
// laneway simulate's engine on the picker's own core and judge the
// policy against the none baseline, the simulator's own speed at scale,
// and one overload scenario both ways, through real processes (modelsim
// servers, the picker and the local gateway) and simulated, side by side.
// With the public traces at hand (TracesDir) it also replays real traffic:
// the Azure code and conversation traces as two classes and the Mooncake
// conversation trace with prefix caching, each against none, round-robin
// and the least-loaded pick on a fleet sized near capacity, and the
// Mooncake trace's first minutes both ways through internal/testbed/replay.
// docs/tuning.md quotes its figures.
//
// The real-process side starts its processes with internal/testproc as
// internal/testbed/demo does; its open-loop load client replays a simulator trace
// through the gateway.
package quality
