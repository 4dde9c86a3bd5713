// Package replica is the wire format of the replica link (SPEC §15): the
// one long-lived gRPC stream per follower over which a follower sends the
// leader its tickets (what pkg/sched needs to admit a request the
// follower parsed itself) and their release events, and the leader sends
// back its decisions. It holds the messages, their encoding, the gRPC
// codec and service description; internal/ha drives the link.
//
// The messages are protocol buffers, described by replica.proto next to
// this file, and encoded by hand with protowire: the build needs no
// protoc, and the encoder writes a ticket straight from a sched.Ticket
// without an intermediate message. A test decodes the hand encoding
// against the schema, so the two cannot drift apart. Every message of
// the link is a Frame, a batch: a sender packs whatever is waiting into
// one frame, so a busy link costs one gRPC message per batch rather than
// per ticket.
//
// Versions: the first frame each way carries a Hello with Version. A
// leader and a follower of different versions refuse each other (the
// follower logs which versions met and schedules locally) rather than
// misread a ticket. Version changes with anything that changes what a
// field means, including pkg/affinity's sparse grid (below); new fields
// of the same version are skipped by an older reader.
//
// Compact tickets: most of a long prompt's ticket is its block hashes
// (2,048 of them, 16 kB, for a 32k-token prompt at 16 tokens a block).
// The leader's prefix index reads a hash chain only at the positions of
// its sparse grid and at the chain's last position (affinity.GridStride),
// and the core asks it only about the cacheable prefix
// (sched.CacheableBlocks), whose last position is the only other one
// read. A ticket carries the chain's length and the hashes at exactly
// those positions, and the leader rebuilds a chain of the same length
// with them in place (zero elsewhere): every overlap, record and
// eviction of the index is the same as with the whole chain. A 32k-token
// ticket carries 226 hashes (about 1.9 kB); a 256-token one all 16.
//
// Cost: encoding and decoding are linear in the ticket's size, with one
// allocation per decoded string and one for the rebuilt chain.
package replica
