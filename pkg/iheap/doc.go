// Package iheap is Laneway's one binary heap: a generic, intrusive
// min-heap whose items may keep their position, so that an item whose order
// changed is fixed, and an item that left early is removed, in O(log n)
// without a search. The DRR queue (pkg/drr: its lanes, candidate indexes
// and tenant rings), the engine's finishing requests (pkg/engine) and the
// simulator's event queue (internal/testbed/simulate) all use it, and each
// runs the conformance suite of pkg/iheap/iheaptest against its own wrapper.
//
// # Order
//
// Every entry carries a 64-bit key next to its item, and entries are ordered
// by key, then, among equal keys, by the less function given to New. A
// caller whose order fits 64 bits uses the key alone; one with a richer
// order packs a monotone prefix of it into the key (key(a) < key(b) must
// imply that a goes first) and leaves the rest to less, which must be a
// strict weak order consistent with the keys. The key is what keeps the
// heap fast: most comparisons read two integers from the entry array, with
// no call and no pointer to chase into the items.
//
// # Positions
//
// An item that keeps its position hands the heap the int32 field it keeps
// it in when it is pushed. The heap stores the item's position there each
// time it moves the item, and -1 when the item leaves (Pop, Remove); Fix and
// Remove take that position. The field's address sits in the entry, so a
// move records a position with a plain store. A callback (an index setter)
// would be a call per move: Go compiles a generic function once per shape
// of its type arguments and calls func values and type-parameter methods
// indirectly from there, never inlined, which measured about 5% more
// instructions on drr's benchmarks than the hand-written heaps this package
// replaced, where the field costs 8 bytes per entry. Items that leave only
// through Pop push a nil field.
//
// # Invariants
//
// After every call: no entry goes before its parent (the heap property),
// and every item pushed with a position field finds its position there.
// Sifts move a hole instead of swapping, so each moved item is written, and
// its position stored, once. The layout after any sequence of calls is the
// one classic swap-based sifts (container/heap's) would give, so ties that
// less leaves open break the same way as in the heaps this replaced.
//
// # Cost
//
// Push, Pop, Remove and Fix are O(log n) key comparisons, with a call of
// less only on equal keys. They do not allocate once the entry array has
// grown to the heap's largest size (Compact is the only call that gives
// memory back). There is no interface in the way: the heap is generic, so
// items are not boxed and the entry array holds them unwrapped (which is
// why the package does not use container/heap). A Heap is four words; an
// entry is the key, the item and the position field's address (24 bytes
// for a pointer item). It is not safe for concurrent use.
package iheap
