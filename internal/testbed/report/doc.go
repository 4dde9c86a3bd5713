// Package report draws what the lab's runs show people: the progress of a
// run on stderr, and figures of side-by-side panels written as PNG and SVG.
// The demo (internal/testbed/demo) and the simulator
// (internal/testbed/simulate) both report through it, so a class has the
// same colour and a run the same progress line in both.
//
// Invariants: progress never goes to the writer of tables and JSON (the
// caller hands it stderr), and shows nothing before a run has taken a
// second; a figure's lines have at most MaxPoints points, however many
// requests they summarise.
//
// Cost: progress formats a line only when what it shows changes (at most
// once per percent, or per second on a terminal); a figure costs
// O(MaxPoints) per line to draw, plus what its caller spends on the data.
package report
