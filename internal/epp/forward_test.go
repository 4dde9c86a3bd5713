package epp

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/laneway-dev/laneway/internal/tlsutil"
)

// immediate503 is a leader's ImmediateResponse with an x-laneway-reason.
func immediate503(code typev3.StatusCode, reason string, raw bool) *extprocv3.ProcessingResponse {
	h := &corev3.HeaderValue{Key: "x-laneway-reason", Value: reason}
	if raw {
		h = &corev3.HeaderValue{Key: "x-laneway-reason", RawValue: []byte(reason)}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: code},
		Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{Header: h}}},
	}}}
}

func TestLocalRefusal(t *testing.T) {
	tests := []struct {
		name string
		resp *extprocv3.ProcessingResponse
		want string
	}{
		{"shutting down", immediate503(typev3.StatusCode_ServiceUnavailable, ReasonShuttingDown, false), ReasonShuttingDown},
		{"not ready, raw value", immediate503(typev3.StatusCode_ServiceUnavailable, ReasonNotReady, true), ReasonNotReady},
		{"policy invalid", immediate503(typev3.StatusCode_ServiceUnavailable, ReasonPolicyInvalid, false), ReasonPolicyInvalid},
		{"no endpoints is the pool's answer", immediate503(typev3.StatusCode_ServiceUnavailable, "no_endpoints", false), ""},
		{"a 429 is the client's answer", immediate503(typev3.StatusCode_TooManyRequests, ReasonShuttingDown, false), ""},
		{"a pick", &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{}}, ""},
	}
	for _, tt := range tests {
		if got := localRefusal(tt.resp); got != tt.want {
			t.Errorf("%s: localRefusal = %q, want %q", tt.name, got, tt.want)
		}
	}
}

// fakeGateway is the gateway's side of a server stream: Recv hands out
// msgs, then io.EOF.
type fakeGateway struct {
	grpc.ServerStream
	ctx  context.Context
	msgs chan *extprocv3.ProcessingRequest
}

func (g *fakeGateway) Context() context.Context { return g.ctx }
func (g *fakeGateway) Recv() (*extprocv3.ProcessingRequest, error) {
	select {
	case m, ok := <-g.msgs:
		if !ok {
			return nil, io.EOF
		}
		return m, nil
	case <-g.ctx.Done():
		return nil, g.ctx.Err()
	}
}
func (g *fakeGateway) Send(*extprocv3.ProcessingResponse) error { return nil }

// TestPumpDivert: messages kept before a divert are replayed in order, and
// the gateway's later ones, and its end, follow through the replay stream;
// a stream past replayLimit cannot be diverted.
func TestPumpDivert(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gw := &fakeGateway{ctx: ctx, msgs: make(chan *extprocv3.ProcessingRequest)}
	p := &pump{gw: gw, kept: true, rest: make(chan recvResult)}
	p.broken.Store(true) // no upstream: only keep
	go p.run(func() {})
	msg := func(i int) *extprocv3.ProcessingRequest {
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte{byte(i)}}}}
	}
	gw.msgs <- msg(0)
	gw.msgs <- msg(1)
	gw.msgs <- msg(2) // the pump has taken msg(1) once this send returns
	rs, ok := p.divert()
	if !ok {
		t.Fatal("divert of a kept stream failed")
	}
	rs.ExternalProcessor_ProcessServer = gw
	go func() { gw.msgs <- msg(3); close(gw.msgs) }()
	for i := 0; i < 4; i++ {
		m, err := rs.Recv()
		if err != nil || m.GetRequestBody().GetBody()[0] != byte(i) {
			t.Fatalf("replay message %d: %v %v", i, m, err)
		}
	}
	if _, err := rs.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the replay: %v, want io.EOF", err)
	}
	if _, err := rs.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("Recv after the end: %v, want io.EOF again", err)
	}

	big := &pump{gw: &fakeGateway{ctx: ctx, msgs: make(chan *extprocv3.ProcessingRequest, 1)}, kept: true, rest: make(chan recvResult)}
	big.broken.Store(true)
	go big.run(func() {})
	bg := big.gw.(*fakeGateway)
	bg.msgs <- &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: make([]byte, replayLimit+1)}}}
	bg.msgs <- msg(1) // taken only after the big one was counted
	bg.msgs <- msg(2)
	if _, ok := big.divert(); ok {
		t.Error("a stream past replayLimit was diverted")
	}
}

// TestLeaderTLSReloadsTheCA: the leader link's CA is read again when the
// mounted file changes (a rotated Secret swaps it), without a new dial: a
// leader signed by the new CA is refused before the swap and accepted
// after it, on the same config.
func TestLeaderTLSReloadsTheCA(t *testing.T) {
	dir, next := t.TempDir(), t.TempDir()
	writeCA(t, dir, true)
	rotated := writeCA(t, next, true)
	o := testOptions(func(o *Options) { o.CertPath = dir })
	cfg, err := leaderTLS(o, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake(t, cfg, rotated); err == nil {
		t.Fatal("a leader signed by a CA not yet mounted was accepted")
	}
	data, err := os.ReadFile(filepath.Join(next, tlsutil.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, ".ca.tmp") // a new file swapped in, as the kubelet's symlink swap does
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, tlsutil.CAFile)); err != nil {
		t.Fatal(err)
	}
	if err := handshake(t, cfg, rotated); err != nil {
		t.Fatalf("after the CA rotated, its leader is refused: %v", err)
	}
}

// countingBudget is a held-body budget that records what is taken.
type countingBudget struct {
	mu          sync.Mutex
	limit, held int64
}

func (b *countingBudget) ReserveHeldBodyBytes(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held+n > b.limit {
		return false
	}
	b.held += n
	return true
}

func (b *countingBudget) ReleaseHeldBodyBytes(n int64) {
	b.mu.Lock()
	b.held -= n
	b.mu.Unlock()
}

func (b *countingBudget) now() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held
}

// TestPumpCountsCopiesInTheBudget: the kept messages hold their bytes in
// the replica's budget; a message the budget cannot take ends the keeping
// and gives every kept byte back; commit and divert give them back too.
func TestPumpCountsCopiesInTheBudget(t *testing.T) {
	body := func(n int) *extprocv3.ProcessingRequest {
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: make([]byte, n)}}}
	}
	size := int64(proto.Size(body(1000)))
	tests := []struct {
		name      string
		limit     int64
		end       func(p *pump) bool // ends the keeping; reports whether the copy was diverted
		wantKept  int64              // bytes held after two messages
		wantAfter bool               // divert succeeds
	}{
		{"both fit, commit", 3 * size, func(p *pump) bool { p.commit(); return false }, 2 * size, false},
		{"both fit, divert", 3 * size, func(p *pump) bool { _, ok := p.divert(); return ok }, 2 * size, true},
		{"the second does not fit", size + size/2, func(p *pump) bool { _, ok := p.divert(); return ok }, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			b := &countingBudget{limit: tt.limit}
			gw := &fakeGateway{ctx: ctx, msgs: make(chan *extprocv3.ProcessingRequest, 2)}
			p := &pump{gw: gw, held: b, kept: true, rest: make(chan recvResult)}
			p.broken.Store(true)
			gw.msgs <- body(1000)
			gw.msgs <- body(1000)
			close(gw.msgs)
			p.run(func() {}) // returns at the gateway's end, both messages counted
			if got := b.now(); got != tt.wantKept {
				t.Fatalf("budget holds %d bytes for two kept %d-byte messages, want %d", got, size, tt.wantKept)
			}
			if got := tt.end(p); got != tt.wantAfter {
				t.Errorf("diverted = %v, want %v", got, tt.wantAfter)
			}
			if got := b.now(); got != 0 {
				t.Errorf("budget holds %d bytes after the keeping ended, want 0", got)
			}
		})
	}
}

// writeCA writes a CA and a leaf it signs into dir as tls.crt/tls.key and,
// when withCA, ca.crt.
func writeCA(t *testing.T, dir string, withCA bool) (leaf tls.Certificate) {
	t.Helper()
	ca, err := tlsutil.SelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	leaf = signedLeaf(t, ca)
	certPEM, keyPEM, err := tlsutil.EncodePEM(leaf)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, _, err := tlsutil.EncodePEM(ca)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{tlsutil.CertFile: certPEM, tlsutil.KeyFile: keyPEM}
	if withCA {
		files["ca.crt"] = caPEM
	} else {
		files[tlsutil.CertFile] = append(certPEM, caPEM...)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return leaf
}

// TestLeaderTLS: a follower accepts the leader it is told to trust and
// no other: the pinned self-signed certificate without --cert-path, the
// chain to --cert-path's CA with it, anything with --leader-tls-insecure.
func TestLeaderTLS(t *testing.T) {
	selfA, err := tlsutil.SelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	selfB, err := tlsutil.SelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	withCA, bundle, other := t.TempDir(), t.TempDir(), t.TempDir()
	leafCA := writeCA(t, withCA, true)
	leafBundle := writeCA(t, bundle, false)
	writeCA(t, other, true)
	pinA := certPin(selfA.Certificate[0])

	tests := []struct {
		name     string
		opts     func(*Options)
		tag      string
		serve    tls.Certificate
		wantErr  string // from leaderTLS
		accepted bool
	}{
		{name: "pinned self-signed", tag: pinA, serve: selfA, accepted: true},
		{name: "another self-signed", tag: pinA, serve: selfB},
		{name: "no pin on the Lease", tag: "0123456789abcdef", serve: selfA, wantErr: "no certificate pin"},
		{name: "ca.crt of --cert-path", opts: func(o *Options) { o.CertPath = withCA }, serve: leafCA, accepted: true},
		{name: "tls.crt chain of --cert-path", opts: func(o *Options) { o.CertPath = bundle }, serve: leafBundle, accepted: true},
		{name: "a leaf of another CA", opts: func(o *Options) { o.CertPath = other }, serve: leafCA},
		{name: "insecure takes anything", opts: func(o *Options) { o.CertPath = other; o.Kube.LeaderTLSInsecure = true }, serve: selfB, accepted: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := NewOptions()
			if tt.opts != nil {
				tt.opts(o)
			}
			cfg, err := leaderTLS(o, tt.tag)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("leaderTLS = %v, want an error with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := handshake(t, cfg, tt.serve); (err == nil) != tt.accepted {
				t.Errorf("handshake: %v, want accepted %v", err, tt.accepted)
			}
		})
	}
}

// handshake serves cert on loopback and dials it with cfg.
func handshake(t *testing.T, cfg *tls.Config, cert tls.Certificate) error {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", tlsutil.ServerConfig(tlsutil.Static(cert)))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", ln.Addr().String(), cfg)
	if err == nil {
		c.Close()
	}
	return err
}

// signedLeaf is a server certificate for laneway-epp.ns.svc signed by ca.
func signedLeaf(t *testing.T, ca tls.Certificate) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "laneway-epp"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"laneway-epp.ns.svc"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Leaf, &key.PublicKey, ca.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestLeaderTLSPresentsClientCertificate: with --client-ca the leader
// requires a client certificate of everyone, its followers included; a
// follower presents its --cert-path pair (here signed by the CA the leader
// trusts) and gets in, one without --client-ca set presents nothing and is
// refused.
func TestLeaderTLSPresentsClientCertificate(t *testing.T) {
	ca, err := tlsutil.NewCA("laneway replicas")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Replica("laneway-epp")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := tlsutil.EncodePEM(leaf)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, data := range map[string][]byte{tlsutil.CertFile: certPEM, tlsutil.KeyFile: keyPEM, "ca.crt": ca.PEM()} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pool := ca.Pool()
	serve := func(cfg *tls.Config) error {
		t.Helper()
		ln, err := tls.Listen("tcp", "127.0.0.1:0", tlsutil.MutualServerConfig(tlsutil.Static(leaf), func() *x509.CertPool { return pool }))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		accepted := make(chan error, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				accepted <- err
				return
			}
			accepted <- c.(*tls.Conn).Handshake()
			c.Close()
		}()
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), cfg)
		if err == nil {
			c.Close()
		}
		return <-accepted // the leader's verdict on the follower
	}
	for _, tc := range []struct {
		name     string
		clientCA string
		accepted bool
	}{{"with --client-ca", filepath.Join(dir, "ca.crt"), true}, {"without", "", false}} {
		o := NewOptions()
		o.CertPath, o.ClientCA = dir, tc.clientCA
		cfg, err := leaderTLS(o, "")
		if err != nil {
			t.Fatal(err)
		}
		if err := serve(cfg); (err == nil) != tc.accepted {
			t.Errorf("%s: the leader's handshake %v, want accepted %v", tc.name, err, tc.accepted)
		}
	}
}
