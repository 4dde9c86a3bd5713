// Package iheap is Laneway's one binary heap: a generic, intrusive
// min-heap whose items may know their position, so that an item whose order
// changed is fixed, and an item that left early is removed, in O(log n)
// without a search. The DRR queue (pkg/drr: its lanes, candidate indexes
// and tenant rings), the engine's finishing requests (pkg/engine) and the
// simulator's event queue (internal/testbed/simulate) all use it.
//
// # Order
//
// Every entry carries a 64-bit key next to its item, and entries are ordered
// by key, then, among equal keys, by the less function. A caller with an
// order that fits 64 bits uses the key alone; one with a richer order packs
// a monotone prefix of it into the key (key(a) < key(b) must imply that a
// goes first) and leaves the rest to less. The key is what keeps the heap
// fast: most comparisons read two integers from the entry array, with no
// call and no pointer to chase into the items. Less is called only on equal
// keys, and must be a strict weak order consistent with the keys.
//
// # Positions
//
// The index setter, when given, is told each item's new position whenever
// the heap moves it, and -1 when the item leaves (Pop, Remove), so an item
// can keep its position in a field of its own for Fix and Remove. A heap
// without one (a nil setter) is an ordinary priority queue.
//
// # Invariants
//
// After every call: no entry goes before its parent (the heap property),
// and the last position the setter reported for each item is where the
// item is. Sifts move a hole instead of swapping, so the setter is told
// one position per item moved. The layout after any sequence of calls is
// the one the classic swap-based sifts (container/heap's) would give, so
// a tie that less leaves open is broken the same way.
//
// # Cost
//
// Push, Pop, Remove and Fix are O(log n) key comparisons, with a call of
// less only on equal keys and one setter call per item moved. They do not
// allocate once the entry array has grown to the heap's largest size
// (Compact is the only call that gives memory back), and there is no
// interface in the way: the heap is generic, so items are not boxed and
// the entry array holds them unwrapped (which is also why the package does
// not use container/heap). A Heap costs three words and two func values
// plus 8 bytes of key per entry. It is not safe for concurrent use.
package iheap
