package extproc

import "sync/atomic"

// DefaultMaxHeldBodyBytes is Options.MaxHeldBodyBytes' default (512 MiB).
const DefaultMaxHeldBodyBytes = 512 << 20

// maxPrealloc bounds the buffer a content-length header alone makes a
// stream allocate before the bytes arrive: the buffer then grows with the
// body, so a client announcing 16 MiB and sending nothing costs 16 MiB of
// budget but not of memory.
const maxPrealloc = 1 << 20

// budget counts the request body bytes held, or announced and reserved, by
// the streams that have not passed their body back to the gateway yet,
// against a limit. It is safe for concurrent use: every stream of a
// Server shares it.
type budget struct {
	limit int64
	held  atomic.Int64
}

// reserve takes n bytes unless that would pass the limit. It returns the
// bytes held before and whether n was taken.
func (b *budget) reserve(n int64) (held int64, ok bool) {
	for {
		cur := b.held.Load()
		if cur+n > b.limit {
			return cur, false
		}
		if b.held.CompareAndSwap(cur, cur+n) {
			return cur, true
		}
	}
}

// force takes n bytes whatever the limit: bytes a stream already admitted
// must hold (a body replacement) are never refused, and push later
// requests out instead.
func (b *budget) force(n int64) { b.held.Add(n) }

// release gives back n reserved bytes.
func (b *budget) release(n int64) { b.held.Add(-n) }
