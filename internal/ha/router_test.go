package ha

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// fakeStream is a gateway stream with a context and nothing else.
type fakeStream struct {
	extprocv3.ExternalProcessor_ProcessServer
	ctx context.Context
}

func (s fakeStream) Context() context.Context { return s.ctx }

// seenLocal records whether the local handler was told to decide here.
type seenLocal struct{ localOnly bool }

func (l *seenLocal) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	l.localOnly = localOnly(srv.Context())
	return nil
}

// TestForwardedMarkerNeedsAReplica: a stream marked x-laneway-forwarded-by
// is decided here only when its client presented a certificate of the
// replica identity; the marker from a gateway, or over plaintext, is
// ignored (its request goes to the leader as any other).
func TestForwardedMarkerNeedsAReplica(t *testing.T) {
	pool, other := newCA(t, "pool replicas"), newCA(t, "gateways")
	_, peers := replicaDir(t, pool)
	replica, err := pool.Replica("peer")
	if err != nil {
		t.Fatal(err)
	}
	gateway, err := other.Client("envoy")
	if err != nil {
		t.Fatal(err)
	}
	withPeer := func(ctx context.Context, certs ...*x509.Certificate) context.Context {
		return peer.NewContext(ctx, &peer.Peer{AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: certs}}})
	}
	marked := metadata.NewIncomingContext(context.Background(), metadata.Pairs(forwardedByKey, "epp-1_10.0.0.1:9004_ab"))
	for _, tc := range []struct {
		name  string
		ctx   context.Context
		trust bool
		here  bool
	}{
		{"marked by a replica", withPeer(marked, replica.Leaf), true, true},
		{"marked by a gateway", withPeer(marked, gateway.Leaf), true, false},
		{"marked over plaintext", marked, true, false},
		{"marked, no identity to trust", withPeer(marked, replica.Leaf), false, false},
		{"a replica's unmarked stream", withPeer(context.Background(), replica.Leaf), true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &seenLocal{}
			r := NewRouter(l)
			if tc.trust {
				r.TrustPeers(peers)
			}
			if err := r.Process(fakeStream{ctx: tc.ctx}); err != nil {
				t.Fatal(err)
			}
			if l.localOnly != tc.here {
				t.Errorf("decided here only: %v, want %v", l.localOnly, tc.here)
			}
		})
	}
}
