package ha

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// TestPeerMarked: the forwarded marker is honoured only from a peer
// replica. With mutual TLS a peer is a client presenting the replicas'
// own serving certificate; without it, a client at the address the
// marker's holder identity names. A client that sets the marker itself
// (the audit's probe: x-laneway-forwarded-by on a follower) is forwarded
// to the leader like any other stream.
func TestPeerMarked(t *testing.T) {
	serving := x509.Certificate{Raw: []byte("the replicas' serving certificate")}
	gateway := x509.Certificate{Raw: []byte("a gateway's client certificate")}
	ownPin := func() string { return certPin(serving.Raw) }
	tlsFrom := func(certs ...*x509.Certificate) credentials.AuthInfo {
		return credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: certs}}
	}
	tests := []struct {
		name   string
		marker string // "" sets none
		from   string
		auth   credentials.AuthInfo
		mtls   bool
		want   bool
	}{
		{name: "no marker", from: "10.0.0.7:4123"},
		{name: "plaintext, from the holder's address", marker: "epp-a_10.0.0.7:9002_0123456789abcdef", from: "10.0.0.7:4123", want: true},
		{name: "plaintext, from elsewhere", marker: "epp-a_10.0.0.7:9002_0123456789abcdef", from: "10.0.0.9:4123"},
		{name: "plaintext, a marker naming no address", marker: "anything", from: "10.0.0.7:4123"},
		{name: "plaintext, IPv6 holder", marker: "epp-a_[fd00::7]:9002_0123456789abcdef", from: "[fd00::7]:4123", want: true},
		{name: "mutual TLS, the replicas' certificate", marker: "epp-a_10.0.0.7:9002_x", from: "10.0.0.9:4123", auth: tlsFrom(&serving), mtls: true, want: true},
		{name: "mutual TLS, a gateway's certificate from the holder's address", marker: "epp-a_10.0.0.7:9002_x", from: "10.0.0.7:4123", auth: tlsFrom(&gateway), mtls: true},
		{name: "mutual TLS, no certificate", marker: "epp-a_10.0.0.7:9002_x", from: "10.0.0.7:4123", auth: tlsFrom(), mtls: true},
		{name: "mutual TLS, plaintext peer", marker: "epp-a_10.0.0.7:9002_x", from: "10.0.0.7:4123", mtls: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.marker != "" {
				ctx = metadata.NewIncomingContext(ctx, metadata.Pairs(forwardedByKey, tc.marker))
			}
			addr, err := net.ResolveTCPAddr("tcp", tc.from)
			if err != nil {
				t.Fatal(err)
			}
			ctx = peer.NewContext(ctx, &peer.Peer{Addr: addr, AuthInfo: tc.auth})
			pin := func() string { return "" }
			if tc.mtls {
				pin = ownPin
			}
			if got := peerMarked(ctx, pin); got != tc.want {
				t.Errorf("peerMarked = %v, want %v", got, tc.want)
			}
		})
	}
}
