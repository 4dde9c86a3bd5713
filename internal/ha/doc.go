// Package ha is the picker's high availability (SPEC §15): leader election
// on the pool's Lease, and the follower's forwarding of ext_proc streams to
// the leader, whose one queue then orders all of the pool's requests.
//
// What internal/epp uses:
//
//   - Identity, LeaseLock and NewElector build this replica's Elector;
//     its Run campaigns (a part of the Server), IsLeader and Leader say
//     who leads now;
//   - NewRouter is the ext_proc service registered on the gRPC server:
//     every stream goes to the local handler until Router.Follow, after
//     which the Router decides per stream whether it is served here (this
//     replica leads; no leader is reachable; the stream was forwarded to
//     us already; the replica's gate is closed) or forwarded to the
//     leader; LinkOptions and ServingPin say how the leader is dialled
//     and trusted.
//
// State, each with one owner:
//
//   - leadership (an atomic flag) and the Lease record last seen (holder,
//     renew time, when it last changed by this replica's clock, an
//     immutable observation behind an atomic pointer): the Elector, set by
//     client-go's elector callbacks and by every read or renewal of the
//     Lease;
//   - the connection to the leader, its stream count, and a holder that
//     could not be dialled: the forwarder, under its mutex; a connection
//     is closed once it is neither the current leader's nor in use;
//   - per forwarded stream, the gateway's messages kept until the
//     leader's first answer (at most replayLimit bytes, also counted in
//     the replica's held-body budget): that stream's pump.
//
// Goroutines: Elector.Run, once the replica synced, runs client-go's
// leader elector (its acquire and renew loop, and for each term it leads
// a goroutine running the leader's work, the status writer) and one
// goroutine that ends the campaign when the shutdown begins; a lost Lease
// starts a new campaign instead of exiting; after the campaign it only
// reads the Lease every retry period until its context ends, so the
// streams still arriving during the shutdown delay go to the next leader.
// A forwarded stream adds one goroutine (the pump: the gateway's messages
// up to the leader) beside the stream's own (the leader's answers down);
// gRPC runs its own for the leader connection.
//
// Exactly once: every stream gets exactly one answer, from the leader or
// from the local handler, so the gateway sends the request to at most one
// endpoint, and whatever another replica held for it is given back.
//
//   - A stream is forwarded at most once: a follower marks it with its
//     identity (x-laneway-forwarded-by), and a replica never forwards a
//     stream a peer marked, so replicas with crossed views of the Lease
//     cannot bounce it between them. A mark counts only from a peer
//     (peerMarked: the replicas' certificate with mutual TLS, else the
//     address the mark names), so a client cannot mark its own stream to
//     be scheduled on a follower, outside the leader's queue.
//   - Until the leader's first answer nothing has reached the gateway,
//     and the pump keeps every message it passed up. If the leader fails
//     then, or refuses with a replica-local 503 (FollowConfig.Refusals:
//     it did not schedule the request), the upstream stream is cancelled,
//     which releases anything the leader held for it (a queued request
//     leaves its queue, a grant whose answer was lost is given back as
//     the stream ends), and the kept messages are replayed into the local
//     handler, which answers once.
//   - Once the leader's first answer is passed down, the copies are
//     dropped (commit) and there is no going back: a later failure of
//     the leader ends the stream with an error, never a second answer.
//     A stream whose copies could not all be kept (past replayLimit, or
//     beyond the held-body budget) cannot fall back either, and ends with
//     Unavailable if the leader fails before answering.
//
// Cost: a stream that is not forwarded pays one atomic load and the
// leader check; a forwarded one a proxy hop and, until the leader
// answers, a copy of its messages.
package ha
