package metrics

import (
	"sync"
	"sync/atomic"
)

// Children caches the children of a metric vector by one key (a label
// value, or a combination the caller encodes), so a per-request update
// costs a map read instead of hashing and comparing label values on every
// call. Lookups take no lock: the map is replaced, never modified, when a
// key is added, which happens once per key (label sets are small: classes,
// outcomes, endpoints). Keys leave only through Retain. The zero value is
// not usable; use NewChildren.
type Children[T any] struct {
	m    atomic.Pointer[map[string]T]
	mu   sync.Mutex // serialises additions
	make func(key string) T
}

// NewChildren returns a cache that makes a missing child with mk (for
// example a vector's WithLabelValues).
func NewChildren[T any](mk func(key string) T) *Children[T] {
	c := &Children[T]{make: mk}
	c.m.Store(&map[string]T{})
	return c
}

// Get returns the child for key, making it on first use. It is safe for
// concurrent use.
func (c *Children[T]) Get(key string) T {
	if v, ok := (*c.m.Load())[key]; ok {
		return v
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok := (*c.m.Load())[key]; ok {
		return v
	}
	return c.addLocked(key)
}

// addLocked makes key's child and publishes it; c.mu is held.
func (c *Children[T]) addLocked(key string) T {
	old := *c.m.Load()
	v := c.make(key)
	next := make(map[string]T, len(old)+1)
	for k, x := range old {
		next[k] = x
	}
	next[key] = v
	c.m.Store(&next)
	return v
}

// GetIf is Get for keys whose set Retain maintains: a missing child is
// made only when allowed(key) holds, checked under the lock Retain takes,
// so a late update for a key that has just left cannot bring its series
// back (the caller changes what allowed reports before it calls Retain).
// It reports whether it returned a child. It is safe for concurrent use.
func (c *Children[T]) GetIf(key string, allowed func(string) bool) (T, bool) {
	if v, ok := (*c.m.Load())[key]; ok {
		return v, true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok := (*c.m.Load())[key]; ok {
		return v, true
	}
	if !allowed(key) {
		var zero T
		return zero, false
	}
	return c.addLocked(key), true
}

// Retain drops the children whose key keep rejects, passing each dropped
// key to drop (a vector's DeleteLabelValues, so that its series leaves
// the page): for keys that stop existing, such as the endpoints of a
// pool whose pods come and go. A later Get of a dropped key makes a new
// child; a caller still holding the old one updates nothing on the page.
func (c *Children[T]) Retain(keep func(key string) bool, drop func(key string)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := *c.m.Load()
	next := make(map[string]T, len(old))
	for k, v := range old {
		if keep(k) {
			next[k] = v
		} else {
			drop(k)
		}
	}
	c.m.Store(&next)
}
