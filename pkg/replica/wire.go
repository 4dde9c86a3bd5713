package replica

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/laneway-dev/laneway/pkg/affinity"
	"github.com/laneway-dev/laneway/pkg/policy"
	"github.com/laneway-dev/laneway/pkg/sched"
)

// Version is the link's protocol version, sent in each side's Hello.
const Version = 1

// Frame is one message of the link, either way: a batch of items. The
// first frame of each side holds the Hello and nothing else.
type Frame struct {
	Hello *Hello
	// Tickets and Releases go from a follower to the leader; Decisions
	// from the leader to a follower.
	Tickets   []Ticket
	Releases  []Release
	Decisions []Decision
}

// Reset empties f for reuse, keeping its slices' storage.
func (f *Frame) Reset() {
	clear(f.Tickets)
	clear(f.Decisions)
	*f = Frame{Tickets: f.Tickets[:0], Releases: f.Releases[:0], Decisions: f.Decisions[:0]}
}

// Empty reports whether f carries nothing.
func (f *Frame) Empty() bool {
	return f.Hello == nil && len(f.Tickets) == 0 && len(f.Releases) == 0 && len(f.Decisions) == 0
}

// Hello opens the link: the sender's protocol version and holder
// identity.
type Hello struct {
	Version  uint32
	Identity string
}

// Ticket is one request offered to the leader: its id on this link, and
// the request as the core admits it. Class and Rights are the core's
// own and are not sent; Blocks travel sparse (see the package doc).
type Ticket struct {
	ID uint64
	// T is the request. An encoded ticket is only read; a decoded one
	// owns its strings and a rebuilt Blocks chain.
	T *sched.Ticket
}

// Event is a release event of a granted ticket, or the follower giving
// up on one.
type Event uint8

// Events. Their numbers are part of the wire format.
const (
	// EventFirstByte: the endpoint sent the first response byte.
	EventFirstByte Event = 1
	// EventDone: the request's stream ended.
	EventDone Event = 2
	// EventCancel: the follower's caller gave up before a decision came
	// (a queued ticket leaves the queue; a grant that crossed it on the
	// wire is given back).
	EventCancel Event = 3
)

// Release is an event of the ticket ID.
type Release struct {
	ID    uint64
	Event Event
}

// Kind says what a Decision is.
type Kind uint8

// Kinds. Their numbers are part of the wire format.
const (
	// KindGrant: the ticket was granted Endpoints.
	KindGrant Kind = 1
	// KindReply: the leader answered the request (a 429 or 503 the
	// follower passes on to the client as it is).
	KindReply Kind = 2
	// KindRetry: the leader did not schedule the ticket (it is not ready,
	// or shutting down): the follower offers it elsewhere.
	KindRetry Kind = 3
)

// Decision is the leader's answer to the ticket ID.
type Decision struct {
	ID   uint64
	Kind Kind
	// A grant: the pick and its fallbacks, the picked endpoint's engine,
	// the priority as the tenant may have it (what may be forwarded to
	// the engine), the cost snapshot's cached tokens and the class index.
	Endpoints []string
	Engine    policy.Engine
	// Prefiller is a disaggregated grant's prefill pod ("" for a grant
	// that serves the whole request).
	Prefiller string
	Priority  int32
	Cached    uint64
	Class     int
	// A reply: the status, x-laneway-reason, message, JSON body and
	// retry-after the leader would have answered itself. A retry carries
	// its reason in Reason.
	Status     int
	Reason     string
	Message    string
	Body       []byte
	RetryAfter time.Duration
	// Queued says the leader held queued requests when it sent the
	// decision: the follower's release events may let one go, so they
	// are wanted at once rather than with the next frame.
	Queued bool
}

// Field numbers (replica.proto).
const (
	frameHello     = 1
	frameTickets   = 2
	frameReleases  = 3
	frameDecisions = 4

	helloVersion  = 1
	helloIdentity = 2

	ticketID          = 1
	ticketModel       = 2
	ticketClassHeader = 3
	ticketRawISL      = 4
	ticketCached      = 5
	ticketPriority    = 6
	ticketStrict      = 7
	ticketHasPriority = 8
	ticketBlockSize   = 9
	ticketBlockCount  = 10
	ticketBlocks      = 11
	ticketAllow       = 12
	ticketHasAllow    = 13
	ticketRankLo      = 14
	ticketRankHi      = 15
	ticketHasRanks    = 16
	ticketTenant      = 17
	ticketWaitedNanos = 18
	ticketOutput      = 19

	releaseID    = 1
	releaseEvent = 2

	decisionID         = 1
	decisionKind       = 2
	decisionEndpoints  = 3
	decisionEngine     = 4
	decisionPriority   = 5
	decisionCached     = 6
	decisionClass      = 7
	decisionStatus     = 8
	decisionReason     = 9
	decisionMessage    = 10
	decisionBody       = 11
	decisionRetryNanos = 12
	decisionQueued     = 13
	decisionPrefiller  = 14
)

// Limits a decoder enforces, so that a corrupt or hostile frame cannot
// make it allocate without bound (a peer is authenticated, but a bug is
// not).
const (
	// MaxBlocks bounds a ticket's chain: 16 Mi tokens in blocks of one.
	MaxBlocks = 1 << 24
)

// Append appends f's encoding to dst. Tickets with blocks are encoded
// sparse; their BlockSize must be positive.
func (f *Frame) Append(dst []byte) []byte {
	var scratch []byte
	if f.Hello != nil {
		scratch = f.Hello.append(scratch[:0])
		dst = appendMessage(dst, frameHello, scratch)
	}
	for i := range f.Tickets {
		scratch = f.Tickets[i].append(scratch[:0])
		dst = appendMessage(dst, frameTickets, scratch)
	}
	for i := range f.Releases {
		scratch = f.Releases[i].append(scratch[:0])
		dst = appendMessage(dst, frameReleases, scratch)
	}
	for i := range f.Decisions {
		scratch = f.Decisions[i].append(scratch[:0])
		dst = appendMessage(dst, frameDecisions, scratch)
	}
	return dst
}

// A frame is its items one after another, so a sender may encode each
// item when it is made (on the goroutine that makes it) and send the
// concatenation of whatever waits as one Raw frame.

// AppendTicket appends ticket id's frame item for t to dst.
func AppendTicket(dst []byte, id uint64, t *sched.Ticket) []byte {
	tk := Ticket{ID: id, T: t}
	return appendItem(dst, frameTickets, tk.append)
}

// AppendRelease appends a release event's frame item to dst.
func AppendRelease(dst []byte, id uint64, ev Event) []byte {
	r := Release{ID: id, Event: ev}
	return appendItem(dst, frameReleases, r.append)
}

// AppendDecision appends a decision's frame item to dst.
func AppendDecision(dst []byte, d *Decision) []byte {
	return appendItem(dst, frameDecisions, d.append)
}

// appendItem appends field num holding the message enc writes, sized in
// place: the length prefix is reserved at its largest and the message
// moved back when its length takes fewer bytes.
func appendItem(dst []byte, num protowire.Number, enc func([]byte) []byte) []byte {
	dst = protowire.AppendTag(dst, num, protowire.BytesType)
	at := len(dst)
	dst = append(dst, 0, 0, 0, 0) // up to 256 MiB: larger than any frame
	dst = enc(dst)
	n := len(dst) - at - 4
	var pre [4]byte
	k := len(protowire.AppendVarint(pre[:0], uint64(n)))
	protowire.AppendVarint(dst[at:at], uint64(n))
	copy(dst[at+k:], dst[at+4:])
	return dst[:len(dst)-(4-k)]
}

// Raw is an encoded frame (items appended with AppendTicket and the
// others), sent as it is.
type Raw []byte

func appendMessage(dst []byte, num protowire.Number, msg []byte) []byte {
	dst = protowire.AppendTag(dst, num, protowire.BytesType)
	return protowire.AppendBytes(dst, msg)
}

func appendVarint(dst []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return dst // proto3: the default is not sent
	}
	dst = protowire.AppendTag(dst, num, protowire.VarintType)
	return protowire.AppendVarint(dst, v)
}

func appendSigned(dst []byte, num protowire.Number, v int64) []byte {
	return appendVarint(dst, num, protowire.EncodeZigZag(v))
}

func appendBool(dst []byte, num protowire.Number, v bool) []byte {
	if !v {
		return dst
	}
	return appendVarint(dst, num, 1)
}

func appendString(dst []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return dst
	}
	dst = protowire.AppendTag(dst, num, protowire.BytesType)
	return protowire.AppendString(dst, s)
}

func (h *Hello) append(dst []byte) []byte {
	dst = appendVarint(dst, helloVersion, uint64(h.Version))
	return appendString(dst, helloIdentity, h.Identity)
}

func (r *Release) append(dst []byte) []byte {
	dst = appendVarint(dst, releaseID, r.ID)
	return appendVarint(dst, releaseEvent, uint64(r.Event))
}

func (tk *Ticket) append(dst []byte) []byte {
	t := tk.T
	dst = appendVarint(dst, ticketID, tk.ID)
	dst = appendString(dst, ticketModel, t.Model)
	dst = appendString(dst, ticketClassHeader, t.ClassHeader)
	dst = appendVarint(dst, ticketRawISL, t.RawISL)
	dst = appendVarint(dst, ticketCached, t.Cached)
	dst = appendSigned(dst, ticketPriority, int64(t.Priority))
	dst = appendVarint(dst, ticketStrict, uint64(t.Strict))
	dst = appendBool(dst, ticketHasPriority, t.HasPriority)
	if n := len(t.Blocks); n > 0 && t.BlockSize > 0 {
		dst = appendVarint(dst, ticketBlockSize, uint64(t.BlockSize))
		dst = appendVarint(dst, ticketBlockCount, uint64(n))
		dst = protowire.AppendTag(dst, ticketBlocks, protowire.BytesType)
		k := sparseCount(n, sched.CacheableBlocks(t.RawISL, n, t.BlockSize))
		dst = protowire.AppendVarint(dst, uint64(8*k))
		forSparse(n, sched.CacheableBlocks(t.RawISL, n, t.BlockSize), func(p int) {
			dst = protowire.AppendFixed64(dst, t.Blocks[p])
		})
	}
	for _, a := range t.Allow {
		dst = protowire.AppendTag(dst, ticketAllow, protowire.BytesType)
		dst = protowire.AppendString(dst, a) // an empty entry is still an entry
	}
	dst = appendBool(dst, ticketHasAllow, t.HasAllow)
	dst = appendSigned(dst, ticketRankLo, int64(t.RankLo))
	dst = appendSigned(dst, ticketRankHi, int64(t.RankHi))
	dst = appendBool(dst, ticketHasRanks, t.HasRanks)
	dst = appendString(dst, ticketTenant, t.Tenant)
	dst = appendVarint(dst, ticketWaitedNanos, uint64(max(0, t.Waited)))
	return appendVarint(dst, ticketOutput, t.OutputTokens)
}

func (d *Decision) append(dst []byte) []byte {
	dst = appendVarint(dst, decisionID, d.ID)
	dst = appendVarint(dst, decisionKind, uint64(d.Kind))
	for _, e := range d.Endpoints {
		dst = protowire.AppendTag(dst, decisionEndpoints, protowire.BytesType)
		dst = protowire.AppendString(dst, e)
	}
	dst = appendVarint(dst, decisionEngine, uint64(d.Engine))
	dst = appendSigned(dst, decisionPriority, int64(d.Priority))
	dst = appendVarint(dst, decisionCached, d.Cached)
	dst = appendVarint(dst, decisionClass, uint64(max(0, d.Class)))
	dst = appendVarint(dst, decisionStatus, uint64(max(0, d.Status)))
	dst = appendString(dst, decisionReason, d.Reason)
	dst = appendString(dst, decisionMessage, d.Message)
	if len(d.Body) > 0 {
		dst = protowire.AppendTag(dst, decisionBody, protowire.BytesType)
		dst = protowire.AppendBytes(dst, d.Body)
	}
	dst = appendVarint(dst, decisionRetryNanos, uint64(max(0, d.RetryAfter)))
	dst = appendString(dst, decisionPrefiller, d.Prefiller)
	return appendBool(dst, decisionQueued, d.Queued)
}

// ErrMalformed wraps every decoding error.
var ErrMalformed = errors.New("malformed replica frame")

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// fields walks the fields of a message, calling fn with each field's
// number, wire type and value: the varint for VarintType, the 8 bytes as
// a uint64 for Fixed64Type, the bytes (aliasing b) for BytesType. Other
// wire types are skipped.
func fields(b []byte, fn func(num protowire.Number, typ protowire.Type, v uint64, bs []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return malformed("tag: %v", protowire.ParseError(n))
		}
		b = b[n:]
		var v uint64
		var bs []byte
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		case protowire.Fixed64Type:
			v, n = protowire.ConsumeFixed64(b)
		case protowire.BytesType:
			bs, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return malformed("field %d: %v", num, protowire.ParseError(n))
			}
			b = b[n:]
			continue
		}
		if n < 0 {
			return malformed("field %d: %v", num, protowire.ParseError(n))
		}
		b = b[n:]
		if err := fn(num, typ, v, bs); err != nil {
			return err
		}
	}
	return nil
}

// Decode replaces f's contents with the frame encoded in b. Every string
// and byte slice is copied (b may be reused once Decode returns).
func (f *Frame) Decode(b []byte) error {
	f.Reset()
	return fields(b, func(num protowire.Number, typ protowire.Type, _ uint64, bs []byte) error {
		if typ != protowire.BytesType {
			return nil // unknown or mistyped: skipped
		}
		switch num {
		case frameHello:
			h := &Hello{}
			if err := h.decode(bs); err != nil {
				return err
			}
			f.Hello = h
		case frameTickets:
			tk := Ticket{T: &sched.Ticket{}}
			if err := tk.decode(bs); err != nil {
				return err
			}
			f.Tickets = append(f.Tickets, tk)
		case frameReleases:
			var r Release
			if err := r.decode(bs); err != nil {
				return err
			}
			f.Releases = append(f.Releases, r)
		case frameDecisions:
			var d Decision
			if err := d.decode(bs); err != nil {
				return err
			}
			f.Decisions = append(f.Decisions, d)
		}
		return nil
	})
}

func (h *Hello) decode(b []byte) error {
	return fields(b, func(num protowire.Number, typ protowire.Type, v uint64, bs []byte) error {
		switch {
		case num == helloVersion && typ == protowire.VarintType:
			h.Version = uint32(min(v, math.MaxUint32))
		case num == helloIdentity && typ == protowire.BytesType:
			h.Identity = string(bs)
		}
		return nil
	})
}

func (r *Release) decode(b []byte) error {
	return fields(b, func(num protowire.Number, typ protowire.Type, v uint64, _ []byte) error {
		switch {
		case num == releaseID && typ == protowire.VarintType:
			r.ID = v
		case num == releaseEvent && typ == protowire.VarintType:
			r.Event = Event(min(v, math.MaxUint8))
		}
		return nil
	})
}

// int32Of narrows a decoded zigzag value, saturating.
func int32Of(v uint64) int32 {
	return int32(max(math.MinInt32, min(math.MaxInt32, protowire.DecodeZigZag(v))))
}

// intOf narrows a decoded unsigned value to a non-negative int.
func intOf(v uint64) int { return int(min(v, math.MaxInt32)) }

func (tk *Ticket) decode(b []byte) error {
	t := tk.T
	var blocks []byte
	var count uint64
	err := fields(b, func(num protowire.Number, typ protowire.Type, v uint64, bs []byte) error {
		if typ == protowire.BytesType {
			switch num {
			case ticketModel:
				t.Model = string(bs)
			case ticketClassHeader:
				t.ClassHeader = string(bs)
			case ticketBlocks:
				blocks = bs
			case ticketAllow:
				t.Allow = append(t.Allow, string(bs))
			case ticketTenant:
				t.Tenant = string(bs)
			}
			return nil
		}
		if typ != protowire.VarintType {
			return nil
		}
		switch num {
		case ticketID:
			tk.ID = v
		case ticketRawISL:
			t.RawISL = v
		case ticketCached:
			t.Cached = v
		case ticketPriority:
			t.Priority = int32Of(v)
		case ticketStrict:
			t.Strict = uint32(min(v, math.MaxUint32))
		case ticketHasPriority:
			t.HasPriority = v != 0
		case ticketBlockSize:
			t.BlockSize = intOf(v)
		case ticketBlockCount:
			count = v
		case ticketHasAllow:
			t.HasAllow = v != 0
		case ticketRankLo:
			t.RankLo = int(int32Of(v))
		case ticketRankHi:
			t.RankHi = int(int32Of(v))
		case ticketHasRanks:
			t.HasRanks = v != 0
		case ticketWaitedNanos:
			t.Waited = time.Duration(min(v, math.MaxInt64))
		case ticketOutput:
			t.OutputTokens = v
		}
		return nil
	})
	if err != nil {
		return err
	}
	if t.HasAllow && t.Allow == nil {
		t.Allow = []string{} // an empty allow-list, not none (503)
	}
	if count == 0 {
		if len(blocks) > 0 {
			return malformed("ticket %d: block hashes without a count", tk.ID)
		}
		// A block size means nothing without blocks, and the encoder
		// writes it only with them: drop it, so a ticket decodes the same
		// after another encoding.
		t.BlockSize = 0
		return nil
	}
	if count > MaxBlocks || t.BlockSize <= 0 {
		return malformed("ticket %d: %d blocks of %d tokens", tk.ID, count, t.BlockSize)
	}
	n := int(count)
	nc := sched.CacheableBlocks(t.RawISL, n, t.BlockSize)
	if k := sparseCount(n, nc); len(blocks) != 8*k {
		return malformed("ticket %d: %d bytes of block hashes for %d blocks, want %d hashes", tk.ID, len(blocks), n, k)
	}
	chain := getChain(n)
	forSparse(n, nc, func(p int) {
		chain[p], _ = protowire.ConsumeFixed64(blocks)
		blocks = blocks[8:]
	})
	t.Blocks = chain
	return nil
}

func (d *Decision) decode(b []byte) error {
	return fields(b, func(num protowire.Number, typ protowire.Type, v uint64, bs []byte) error {
		if typ == protowire.BytesType {
			switch num {
			case decisionEndpoints:
				d.Endpoints = append(d.Endpoints, string(bs))
			case decisionReason:
				d.Reason = string(bs)
			case decisionMessage:
				d.Message = string(bs)
			case decisionPrefiller:
				d.Prefiller = string(bs)
			case decisionBody:
				d.Body = append([]byte(nil), bs...)
			}
			return nil
		}
		if typ != protowire.VarintType {
			return nil
		}
		switch num {
		case decisionID:
			d.ID = v
		case decisionKind:
			d.Kind = Kind(min(v, math.MaxUint8))
		case decisionEngine:
			d.Engine = policy.Engine(min(v, math.MaxUint8))
		case decisionPriority:
			d.Priority = int32Of(v)
		case decisionCached:
			d.Cached = v
		case decisionClass:
			d.Class = intOf(v)
		case decisionStatus:
			d.Status = intOf(v)
		case decisionRetryNanos:
			d.RetryAfter = time.Duration(min(v, math.MaxInt64))
		case decisionQueued:
			d.Queued = v != 0
		}
		return nil
	})
}

// chains recycles rebuilt hash chains (a 32k-token prompt's is 16 kB):
// PutChain gives one back once the core is done with its ticket.
var chains sync.Pool

// maxPooledChain bounds the chains kept (a 16 MiB body could make one of
// several MiB).
const maxPooledChain = 1 << 16

// getChain returns a zeroed chain of n hashes.
func getChain(n int) []uint64 {
	if p, ok := chains.Get().(*[]uint64); ok && cap(*p) >= n {
		c := (*p)[:n]
		clear(c)
		return c
	}
	return make([]uint64, n)
}

// PutChain recycles the Blocks of a decoded ticket once nothing reads
// them any more (the core is done with a request when it left: granted
// or answered).
func PutChain(c []uint64) {
	if cap(c) == 0 || cap(c) > maxPooledChain {
		return
	}
	chains.Put(&c)
}

// sparseCount is how many hashes a ticket of n blocks, nc of them
// cacheable, carries.
func sparseCount(n, nc int) int {
	k := 0
	forSparse(n, nc, func(int) { k++ })
	return k
}

// forSparse calls fn with each position a ticket of n blocks (nc of them
// cacheable) carries, in wire order: the grid positions below n, then the
// last cacheable position and the last position when they are not on the
// grid (the only other positions the index reads: affinity.GridStride).
func forSparse(n, nc int, fn func(p int)) {
	for p := 0; p < n; p += affinity.GridStride(p) {
		fn(p)
	}
	if p := nc - 1; p >= 0 && p < n-1 && !affinity.OnGrid(p) {
		fn(p)
	}
	if p := n - 1; p >= 0 && !affinity.OnGrid(p) {
		fn(p)
	}
}
