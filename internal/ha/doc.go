// Package ha is the picker's high availability (SPEC §15): leader election
// on the pool's Lease, and the replica link over which followers send the
// leader tickets instead of streams, so that every replica carries
// streams and one queue decides.
//
// Every replica terminates its gateways' ext_proc streams and does the
// per-request work itself (internal/epp: the body's one pass, identity,
// hints). What it hands its scheduler is a sched.Ticket. With leader
// election that scheduler is Tickets: while this replica leads, or no
// leader is reachable, its own dispatcher decides; otherwise the ticket
// goes to the leader over the link and Tickets waits for the leader's
// decision. The leader's TicketServer feeds every follower's tickets into
// its own dispatcher (dispatcher.Offer), so the leader's core is the only
// queue, and streams the decisions back. A replica's cost per request is
// what it parses; the leader's per ticket is the core's decision and a
// few hundred bytes of link (docs/scaling.md).
//
// What internal/epp uses:
//
//   - Identity, LeaseLock and NewElector build this replica's Elector; its
//     Run campaigns (a part of the Server), IsLeader and Leader say who
//     leads now. The holder identity names the replica link's address.
//   - LoadPeerTLS reads the replica identity (--replica-cert-path); the
//     link is mutual TLS with it both ways (PeerTLS.ServerOptions for the
//     link's own gRPC server, its dialer for the follower's side).
//   - NewTicketServer is the link's service, registered with
//     replica.Register on the link's server; NewTickets the follower's
//     scheduler, the handler's Acquirer; StaticLeader a fixed leader for
//     standalone replicas (--replica-leader).
//   - NewRouter is the ext_proc service on the picker's port: every stream
//     is the local handler's; a stream marked x-laneway-forwarded-by by a
//     client presenting the replica identity is decided here, never sent
//     on as a ticket (TrustPeers).
//
// The wire format is pkg/replica's: frames (batches) of tickets and
// release events up, decisions down; a hello with the protocol version
// first, and peers of different versions refuse each other.
//
// State, each with one owner:
//
//   - leadership (an atomic flag) and the Lease record last seen (holder,
//     renew time, when it last changed by this replica's clock, an
//     immutable observation behind an atomic pointer): the Elector;
//   - a follower's links (one per leader holder; a new holder retires the
//     others, which close once their grants are done): Tickets, under its
//     mutex; per link, its pending tickets (sent, not decided), its grants
//     (granted, not done) and its outbox of encoded frame items: the link,
//     under its own mutex;
//   - on the leader, per follower link, its offers (queued or granted
//     tickets by id) and its decisions waiting to be sent: the
//     followerLink, under its mutex. The dispatcher's loop reports
//     decisions into it; only the link's receive loop offers and cancels.
//
// Goroutines: Elector.Run (client-go's elector, its terms' leader work,
// and the follow-up reads of the Lease after the campaign). A follower's
// link runs two (the receiver, which dials, says hello and delivers
// decisions; the sender, which writes the outbox) plus gRPC's; a request
// waits in Tickets.Acquire on its own stream's goroutine. The leader runs
// one per follower link beside the stream's own (the sender); the
// dispatcher's loop calls back into the link without blocking. No
// goroutine per ticket on either side.
//
// Exactly once: every stream is answered once, by the replica that holds
// it, so the gateway sends the request to at most one endpoint, and
// whatever a leader held for it is given back.
//
//   - Tickets.Acquire returns once: a grant (the leader's, as a
//     sched.RemoteGrant whose events travel back over the link, or the
//     local dispatcher's), the leader's 429/503 reply, or the caller's
//     context error. A ticket has one id on one link; its decision is
//     delivered to it only while it is pending there, and it leaves the
//     link's table before it is offered anywhere else.
//   - A ticket whose link breaks, or that the leader refuses (not ready,
//     shutting down), before it was decided is offered again with its
//     original arrival (sched.Ticket.Waited): to another holder whose link
//     is up, else here. A decision that crossed the break is dropped with
//     the link (the leader gave back what it held for it).
//   - A caller that gives up while its ticket is pending sends a cancel:
//     the leader takes a queued ticket out of its queue, or gives back a
//     grant that crossed the cancel on the wire.
//   - A follower's link ending on the leader (crash, network cut,
//     shutdown) takes back everything it held: its queued tickets leave
//     the queue, its grants are given back as done (lost). A lost grant
//     whose first byte was reported only stops counting as decoding; one
//     whose first byte was not keeps its prefill charge in its endpoint's
//     engine ledger (pkg/sched, SPEC §5 "Accounting without response
//     events") until the engine's own counters say the prompt left
//     prefill, as a header-only gateway's grant does. The follower drops
//     the old link's release events and links again at its next request
//     (after a second).
//
// Cost: a request on a replica that leads pays one atomic load; a ticket
// one encoding (linear in its sparse hashes, on the request's goroutine),
// a share of a frame both ways and, on the leader, one decode and the
// core's decision. Release events share frames with whatever else waits.
package ha
