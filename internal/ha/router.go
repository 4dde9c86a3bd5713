package ha

import (
	"context"
	"sync/atomic"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// Router is the ext_proc service on the picker's gRPC server. Every
// stream is the replica's own: its handler parses the request and its
// scheduler (Tickets, with leader election) decides where the decision
// is made. The one thing the router adds is the forwarded marker: a
// stream that a peer replica forwarded here (replicas of the version
// before tickets proxied whole streams to their leader) is decided here,
// never sent on as a ticket, so no stream travels between replicas
// twice. The marker counts only on a connection whose client presented
// the replica identity (TrustPeers): any other client could otherwise
// pin its request to the replica it reached, bypassing the leader's
// queue.
type Router struct {
	extprocv3.UnimplementedExternalProcessorServer
	local Local
	peers atomic.Pointer[PeerTLS]
}

// Local is the replica's own ext_proc handler (extproc.Server).
type Local interface {
	Process(extprocv3.ExternalProcessor_ProcessServer) error
}

// NewRouter returns a router that serves every stream with local.
func NewRouter(local Local) *Router { return &Router{local: local} }

// TrustPeers makes the router honour the forwarded marker of a client
// that presents a certificate of p's replicas.
func (r *Router) TrustPeers(p *PeerTLS) { r.peers.Store(p) }

// forwardedByKey is the gRPC metadata a replica sets on a stream it
// forwards to another: its holder identity.
const forwardedByKey = "x-laneway-forwarded-by"

// Process implements extprocv3.ExternalProcessorServer.
func (r *Router) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	if ctx := srv.Context(); forwardedBy(ctx) != "" && r.fromPeer(ctx) {
		return r.local.Process(localStream{srv, WithLocalOnly(ctx)})
	}
	return r.local.Process(srv)
}

// forwardedBy is the stream's forwarded marker, "" without one.
func forwardedBy(ctx context.Context) string {
	if v := metadata.ValueFromIncomingContext(ctx, forwardedByKey); len(v) > 0 {
		return v[0]
	}
	return ""
}

// fromPeer reports whether the stream's client presented a replica's
// certificate.
func (r *Router) fromPeer(ctx context.Context) bool {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return false
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	return ok && r.peers.Load().IsPeer(info.State.PeerCertificates)
}

// localStream is a stream whose context says: decide here.
type localStream struct {
	extprocv3.ExternalProcessor_ProcessServer
	ctx context.Context
}

// Context implements grpc.ServerStream.
func (s localStream) Context() context.Context { return s.ctx }
