package extprocclient_test

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"slices"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	lweppdatastore "sigs.k8s.io/gateway-api-inference-extension/pkg/lwepp/datastore"
	lwepphandlers "sigs.k8s.io/gateway-api-inference-extension/pkg/lwepp/handlers"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
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
