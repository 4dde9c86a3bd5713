package ha

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/laneway-dev/laneway/internal/tlsutil"
)

// replicaPin returns peerMarked's ownPin for link: with mutual TLS the pin
// of the --cert-path pair as it is now (reloaded as the server reloads
// it; a replica serving a rotated pair before its peers do ignores their
// markers until they catch up, which forwards those streams once more),
// else a function returning "".
func replicaPin(link LinkOptions) (func() string, error) {
	if !link.MutualTLS || link.CertPath == "" {
		return func() string { return "" }, nil
	}
	pair, err := tlsutil.NewReloader(link.CertPath, nil)
	if err != nil {
		return nil, fmt.Errorf("--cert-path: the replicas' certificate: %w", err)
	}
	return func() string {
		c, _ := pair.GetCertificate(nil)
		if c == nil || len(c.Certificate) == 0 {
			return "no certificate" // matches no pin: no marker holds
		}
		return certPin(c.Certificate[0])
	}, nil
}

// peerMarked reports whether the stream carries the forwarded marker
// (x-laneway-forwarded-by) of a peer replica, which this replica then
// schedules here instead of forwarding it again. Anyone who reaches the
// ext_proc port can set gRPC metadata, and a follower that honoured any
// marker would schedule that client locally, outside the leader's queue.
//
// ownPin returns the pin of the replicas' serving certificate when the
// replicas require client certificates (mutual TLS, where a follower
// presents its --cert-path pair, the one every replica mounts), "" when
// they do not. With it, a peer is a client whose verified certificate is
// that one: a gateway's certificate is not. Without it, a peer is a
// client connecting from the address the marker's holder identity names:
// that keeps a client from borrowing a replica's identity, but not from
// naming its own address, so only the NetworkPolicy (which admits the
// gateway and the picker's pods) or mutual TLS make the marker hold
// (docs/security.md). A marker that is not a peer's is ignored: the
// stream is forwarded to the leader like any other, never refused.
func peerMarked(ctx context.Context, ownPin func() string) bool {
	marker := forwardedBy(ctx)
	if marker == "" {
		return false
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return false
	}
	if pin := ownPin(); pin != "" {
		info, ok := p.AuthInfo.(credentials.TLSInfo)
		if !ok || len(info.State.PeerCertificates) == 0 {
			return false
		}
		return certPin(info.State.PeerCertificates[0].Raw) == pin
	}
	addr, _, ok := parseHolder(marker)
	if !ok {
		return false
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	claimed, err := netip.ParseAddr(host)
	if err != nil {
		return false // a host name (no $POD_IP): not provable from here
	}
	from, err := netip.ParseAddrPort(p.Addr.String())
	if err != nil {
		return false
	}
	return from.Addr().Unmap() == claimed.Unmap()
}
