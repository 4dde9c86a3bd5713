package sched

// The internals the external tests (package sched_test) use. Those tests
// build their tickets with pkg/sched/schedtest, which the tests of this
// package cannot import: it imports pkg/sched.

// Test helpers of this package, for the external tests.
var (
	NewTestCore = newCore
	ByHeader    = byHeader
	FCFSClass   = class
	AdmitTicket = admit
)

// RecordOn records blocks of bs tokens on the i-th live endpoint in the
// prefix index, as a grant of a request with that prompt there would.
func (c *Core) RecordOn(i int, blocks []uint64, bs int) {
	c.index.Record(int(c.reg.live[i]), blocks, bs, 0)
}
