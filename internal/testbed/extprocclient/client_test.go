package extprocclient_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	lweppdatastore "sigs.k8s.io/gateway-api-inference-extension/pkg/lwepp/datastore"
	lwepphandlers "sigs.k8s.io/gateway-api-inference-extension/pkg/lwepp/handlers"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/pkg/extproc"
)

// onePod is the reference picker's datastore with a single endpoint.
type onePod struct{}

func (onePod) PoolGet() (*lweppdatastore.EndpointPool, error) {
	return &lweppdatastore.EndpointPool{TargetPorts: []int{8000}}, nil
}

func (onePod) PodList(func(*lweppdatastore.Endpoint) bool) []*lweppdatastore.Endpoint {
	return []*lweppdatastore.Endpoint{{PodName: "p0", Address: "10.9.8.7", Port: "8000"}}
}

func serve(t *testing.T, register func(*grpc.Server)) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	gs := grpc.NewServer()
	register(gs)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = gs.Serve(lis)
	}()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() {
		conn.Close()
		gs.Stop()
		<-done
	})
	return conn
}

// TestReferencePicker drives the upstream lightweight reference EPP (the
// load tool's baseline), which answers body messages with plain body
// responses instead of streamed ones; the client must read that as the body
// passing through unchanged, on both the request and the response path.
func TestReferencePicker(t *testing.T) {
	conn := serve(t, func(gs *grpc.Server) {
		extprocv3.RegisterExternalProcessorServer(gs, lwepphandlers.NewStreamingServer(onePod{}))
	})
	c := extprocclient.New(conn, extprocclient.Options{ChunkBytes: 10})
	body := []byte(`{"model":"m","prompt":"twenty-six bytes more"}`)
	ex, err := c.Start(context.Background(), extprocclient.RequestSpec{Path: "/v1/completions", Body: body})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	d := ex.Decision()
	if !d.Routed() || !slices.Equal(d.Endpoints, []string{"10.9.8.7:8000"}) || !slices.Equal(d.MetadataEndpoints, []string{"10.9.8.7:8000"}) {
		t.Fatalf("decision %+v", d)
	}
	if !bytes.Equal(d.Body, body) {
		t.Errorf("forwarded body %q, want %q", d.Body, body)
	}
	if d.Latency <= 0 {
		t.Errorf("latency %v not measured", d.Latency)
	}
	_, out, err := ex.Respond(200, http.Header{"Content-Type": {"text/event-stream"}}, []byte("data: a\n\n"), []byte("data: [DONE]\n\n"))
	if err != nil {
		t.Fatalf("Respond: %v", err)
	}
	if string(out) != "data: a\n\ndata: [DONE]\n\n" {
		t.Errorf("response body %q", out)
	}
	if err := ex.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

func TestStartFailsWithoutPicker(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := extprocclient.New(conn, extprocclient.Options{}).Start(context.Background(), extprocclient.RequestSpec{}); err == nil {
		t.Error("Start succeeded without a picker")
	}
}

// answerWith is a scripted picker that answers the request headers with one
// header mutation option, the way a real picker hands options back.
type answerWith struct {
	extprocv3.UnimplementedExternalProcessorServer
	opt *corev3.HeaderValueOption
}

func (a answerWith) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	if _, err := srv.Recv(); err != nil {
		return err
	}
	if err := srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
			HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{a.opt}},
		}},
	}}); err != nil {
		return err
	}
	for {
		if _, err := srv.Recv(); err != nil {
			return nil
		}
	}
}

// TestHeaderMutationApply: options arrive over a real stream and are
// applied with Envoy's semantics for each append action.
func TestHeaderMutationApply(t *testing.T) {
	opt := func(v string, a corev3.HeaderValueOption_HeaderAppendAction) *corev3.HeaderValueOption {
		return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "x-h", RawValue: []byte(v)}, AppendAction: a}
	}
	tests := []struct {
		name string
		opt  *corev3.HeaderValueOption
		have []string // existing values of x-h
		want []string
	}{
		{name: "default appends", opt: opt("new", corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD), have: []string{"old"}, want: []string{"old", "new"}},
		{name: "overwrite or add", opt: opt("new", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD), have: []string{"old"}, want: []string{"new"}},
		{name: "add if absent, present", opt: opt("new", corev3.HeaderValueOption_ADD_IF_ABSENT), have: []string{"old"}, want: []string{"old"}},
		{name: "add if absent, absent", opt: opt("new", corev3.HeaderValueOption_ADD_IF_ABSENT), want: []string{"new"}},
		{name: "overwrite if exists, absent", opt: opt("new", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS), want: nil},
		{name: "overwrite if exists, present", opt: opt("new", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS), have: []string{"old", "older"}, want: []string{"new"}},
		{name: "string value, key lower-cased", opt: &corev3.HeaderValueOption{
			Header: &corev3.HeaderValue{Key: "X-H", Value: "new"}, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}, have: []string{"old"}, want: []string{"new"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			conn := serve(t, func(gs *grpc.Server) { extprocv3.RegisterExternalProcessorServer(gs, answerWith{opt: tc.opt}) })
			ex, err := extprocclient.New(conn, extprocclient.Options{}).Start(context.Background(), extprocclient.RequestSpec{})
			if err != nil {
				t.Fatalf("Start: %v", err)
			}
			defer ex.Close()
			h := http.Header{}
			for _, v := range tc.have {
				h.Add("x-h", v)
			}
			ex.Decision().Mutation.Apply(h)
			if got := h.Values("x-h"); !slices.Equal(got, tc.want) {
				t.Errorf("x-h = %v, want %v", got, tc.want)
			}
		})
	}
}

// recorder is a scripted picker that records what a stream carried: every
// message, and whether the client half-closed it. It answers the request
// the way Laneway's picker does in FULL_DUPLEX_STREAMED mode (the pick on
// the headers answer, the body streamed back) and ends the stream when
// the client half-closes; with hang it never ends a stream itself.
type recorder struct {
	extprocv3.UnimplementedExternalProcessorServer
	hang    bool
	streams chan recorded
}

type recorded struct {
	msgs       []*extprocv3.ProcessingRequest
	halfClosed bool
}

func (r *recorder) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	var rec recorded
	defer func() { r.streams <- rec }()
	var body []byte
	for {
		m, err := srv.Recv()
		if err != nil {
			rec.halfClosed = errors.Is(err, io.EOF)
			if r.hang && rec.halfClosed {
				<-srv.Context().Done()
			}
			return nil
		}
		rec.msgs = append(rec.msgs, m)
		eos := false
		switch q := m.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			eos = q.RequestHeaders.GetEndOfStream()
		case *extprocv3.ProcessingRequest_RequestBody:
			body = append(body, q.RequestBody.GetBody()...)
			eos = q.RequestBody.GetEndOfStream()
		}
		if !eos {
			continue
		}
		if err := srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
				HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
					{Header: &corev3.HeaderValue{Key: extproc.HeaderDestinationEndpoint, RawValue: []byte("10.0.0.1:8000")}},
					{Header: &corev3.HeaderValue{Key: "x-other", RawValue: []byte("kept by Envoy only")}},
				}},
			}},
		}}); err != nil {
			return err
		}
		if len(body) > 0 {
			if err := srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
				RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
					Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body, EndOfStream: true}},
				}}},
			}}); err != nil {
				return err
			}
		}
	}
}

// countingListener counts the connections accepted.
type countingListener struct {
	net.Listener
	n atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// TestHeaderOnlyShapes plays the two header-only gateways against a
// recording picker: what each sends, that it half-closes after the
// request and returns once the picker ends the stream, that it refuses
// response phases, and how many connections it opens.
func TestHeaderOnlyShapes(t *testing.T) {
	body := []byte(`{"model":"m","prompt":"a prompt of some length"}`)
	header := http.Header{"X-Class": {"premium"}, "content-type": {"application/json"}}
	tests := []struct {
		name      string
		shape     extprocclient.Shape
		perReq    bool
		bodyMsgs  int
		wantConns int32
		check     func(t *testing.T, first *extprocv3.ProcessingRequest)
		wantMut   []string
	}{
		{
			name: "nginx shim", shape: extprocclient.NginxShim, perReq: true, bodyMsgs: 1, wantConns: 2,
			wantMut: []string{extproc.HeaderDestinationEndpoint},
			check: func(t *testing.T, first *extprocv3.ProcessingRequest) {
				if first.GetProtocolConfig() != nil {
					t.Errorf("protocol_config %v sent; the shim sends none", first.GetProtocolConfig())
				}
				got := map[string]string{}
				for _, h := range first.GetRequestHeaders().GetHeaders().GetHeaders() {
					if len(h.GetRawValue()) > 0 {
						t.Errorf("header %s in raw_value; the shim uses value", h.GetKey())
					}
					got[h.GetKey()] = h.GetValue()
				}
				want := map[string]string{"X-Class": "premium", "Content-Type": "application/json", "Content-Length": strconv.Itoa(len(body))}
				if !maps.Equal(got, want) {
					t.Errorf("headers %v, want %v", got, want)
				}
			},
		},
		{
			name: "envoy skip", shape: extprocclient.EnvoySkip, bodyMsgs: 5, wantConns: 1,
			wantMut: []string{extproc.HeaderDestinationEndpoint, "x-other"},
			check: func(t *testing.T, first *extprocv3.ProcessingRequest) {
				pc := first.GetProtocolConfig()
				if pc.GetRequestBodyMode() != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED || pc.GetResponseBodyMode() != filterv3.ProcessingMode_NONE {
					t.Errorf("protocol_config %v, want request FULL_DUPLEX_STREAMED, response NONE", pc)
				}
				hs := first.GetRequestHeaders().GetHeaders().GetHeaders()
				if hs[0].GetKey() != ":authority" || string(hs[0].GetRawValue()) != "localhost" {
					t.Errorf("first header %v, want :authority in raw_value", hs[0])
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{streams: make(chan recorded, 2)}
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			cl := &countingListener{Listener: lis}
			gs := grpc.NewServer()
			extprocv3.RegisterExternalProcessorServer(gs, rec)
			go func() { _ = gs.Serve(cl) }()
			t.Cleanup(gs.Stop)
			dial := func() (*grpc.ClientConn, error) {
				return grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			}
			opts := extprocclient.Options{Shape: tc.shape, ChunkBytes: 10}
			var c *extprocclient.Client
			if tc.perReq {
				c = extprocclient.NewPerRequest(dial, opts)
			} else {
				conn, err := dial()
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { conn.Close() })
				c = extprocclient.New(conn, opts)
			}
			for i := range 2 {
				ex, err := c.Start(context.Background(), extprocclient.RequestSpec{Path: "/v1/completions", Headers: header, Body: body})
				if err != nil {
					t.Fatalf("exchange %d: Start: %v", i, err)
				}
				if !ex.Ended() {
					t.Errorf("exchange %d: not ended after Start", i)
				}
				// The picker ended the stream before Start returned.
				r := <-rec.streams
				d := ex.Decision()
				if !d.Routed() || !slices.Equal(d.Endpoints, []string{"10.0.0.1:8000"}) || !bytes.Equal(d.Body, body) {
					t.Errorf("exchange %d: decision %+v", i, d)
				}
				var keys []string
				for _, h := range d.Mutation.Set {
					keys = append(keys, h.Key)
				}
				if !slices.Equal(keys, tc.wantMut) {
					t.Errorf("exchange %d: mutation sets %v, want %v", i, keys, tc.wantMut)
				}
				if !r.halfClosed {
					t.Errorf("exchange %d: the client did not half-close", i)
				}
				if n := len(r.msgs); n != 1+tc.bodyMsgs {
					t.Fatalf("exchange %d: %d messages, want headers and %d body", i, n, tc.bodyMsgs)
				}
				tc.check(t, r.msgs[0])
				last := r.msgs[len(r.msgs)-1].GetRequestBody()
				if !last.GetEndOfStream() {
					t.Errorf("exchange %d: last message %v, want the body's end", i, r.msgs[len(r.msgs)-1])
				}
				if _, err := ex.SendResponseHeaders(200, nil, false, ""); err == nil {
					t.Errorf("exchange %d: response headers accepted by a header-only shape", i)
				}
				if err := ex.Close(); err != nil {
					t.Errorf("exchange %d: Close: %v", i, err)
				}
			}
			if n := cl.n.Load(); n != tc.wantConns {
				t.Errorf("%d connections for 2 exchanges, want %d", n, tc.wantConns)
			}
		})
	}
}

// TestHeaderOnlyWaitsForTheEnd: a picker that answers but never ends the
// stream keeps a header-only Start from returning until its context ends.
func TestHeaderOnlyWaitsForTheEnd(t *testing.T) {
	rec := &recorder{hang: true, streams: make(chan recorded, 1)}
	conn := serve(t, func(gs *grpc.Server) { extprocv3.RegisterExternalProcessorServer(gs, rec) })
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := extprocclient.New(conn, extprocclient.Options{Shape: extprocclient.EnvoySkip}).
		Start(ctx, extprocclient.RequestSpec{Body: []byte("{}")})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("Start: %v, want the deadline's error", err)
	}
	if r := <-rec.streams; !r.halfClosed {
		t.Error("the client did not half-close")
	}
}
