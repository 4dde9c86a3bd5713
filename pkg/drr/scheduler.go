package drr

// Item is a queued request: the immutable snapshot of its Request plus the
// scheduler's bookkeeping. The pointer is the handle for Remove.
type Item struct {
	Request
	// unexported bookkeeping (heap positions, order key, sequence) follows
}

// Scheduler is the policy-class DRR queue. It is not safe for concurrent
// use: one goroutine (the dispatcher) owns it.
type Scheduler struct{}

// New returns a scheduler for the given classes (at least one). The ring
// order is the slice order.
func New(classes []ClassConfig) (*Scheduler, error) { panic("unimplemented") }

// Offer admits a request (SPEC §5). It returns (nil, nil) when the request
// should be dispatched directly (its class does not queue, or the class has
// no backlog and allBusy is false); an Item when it was queued; or a
// *Rejection when a queue limit, scaled by endpoints, is reached. allBusy
// is the caller's busy test over the request's eligible endpoints.
func (s *Scheduler) Offer(r Request, endpoints int, allBusy bool) (*Item, error) {
	panic("unimplemented")
}

// Pop runs one arbitration (SPEC §4) and returns the next item to leave the
// queue and why. Expired items (WaitBudget elapsed at now) leave first;
// then heads judged Unroutable (Outcome NoRoute); then one DRR dispatch. It returns (nil, None) when
// nothing can leave. Call it in a loop until None.
func (s *Scheduler) Pop(now int64, p Probe) (*Item, Outcome) { panic("unimplemented") }

// Remove takes a queued item out (its client went away) in O(log n). It
// reports false if the item is no longer queued.
func (s *Scheduler) Remove(it *Item) bool { panic("unimplemented") }

// EndpointChanged invalidates the cached verdicts of every lane of ep, in
// every class, so that the next Pop asks the Probe again.
func (s *Scheduler) EndpointChanged(ep EndpointID) { panic("unimplemented") }

// NextExpiry returns the earliest time a queued item's WaitBudget runs out.
func (s *Scheduler) NextExpiry() (at int64, ok bool) { panic("unimplemented") }

// SetClasses replaces the class set without losing or reordering queued
// requests. classify maps each queued item to its class index in the new
// set (the scheduler then keeps its arrival order); classes that keep their
// name keep their deficit.
func (s *Scheduler) SetClasses(classes []ClassConfig, classify func(*Item) int) error {
	panic("unimplemented")
}

// Stats returns per-class statistics in ring order.
func (s *Scheduler) Stats() []ClassStats { panic("unimplemented") }

// Len returns the number of queued requests.
func (s *Scheduler) Len() int { panic("unimplemented") }
