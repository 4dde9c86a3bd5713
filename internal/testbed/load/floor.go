package load

import (
	"errors"
	"io"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/laneway-dev/laneway/internal/epp"
	"github.com/laneway-dev/laneway/internal/tlsutil"
)

// FloorProcessor is the least an ext_proc endpoint picker can do on the
// gateway protocol Laneway speaks: it answers the end of every request body
// with the same endpoint (header and envoy.lb metadata, as a pick) and
// streams every body back, with no parsing, queueing, accounting or
// metrics. Measured by the same load tool in the same minutes, it is this
// machine's transport floor: grpc-go, HTTP/2, TLS and the loopback hop.
// Laneway's latency above it is what Laneway's own work adds.
type FloorProcessor struct {
	extprocv3.UnimplementedExternalProcessorServer
	// Endpoint is the "ip:port" every request is sent to.
	Endpoint string
}

// Process answers one stream in the FULL_DUPLEX_STREAMED shape Laneway
// answers it.
func (f *FloorProcessor) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		req, err := srv.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		var out []*extprocv3.ProcessingResponse
		switch r := req.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			if r.RequestHeaders.EndOfStream {
				out = append(out, f.pick())
			}
		case *extprocv3.ProcessingRequest_RequestBody:
			if r.RequestBody.EndOfStream {
				out = append(out, f.pick())
			}
			out = append(out, streamedBack(r.RequestBody, true))
		case *extprocv3.ProcessingRequest_RequestTrailers:
			out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}})
		case *extprocv3.ProcessingRequest_ResponseBody:
			out = append(out, streamedBack(r.ResponseBody, false))
		case *extprocv3.ProcessingRequest_ResponseTrailers:
			out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}})
		}
		for _, m := range out {
			if err := srv.Send(m); err != nil {
				return err
			}
		}
	}
}

// pick is the request headers answer naming f.Endpoint.
func (f *FloorProcessor) pick() *extprocv3.ProcessingResponse {
	dst := structpb.NewStringValue(f.Endpoint)
	lb := structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"x-gateway-destination-endpoint": dst}})
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{
				ClearRouteCache: true,
				HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
					Header:       &corev3.HeaderValue{Key: "x-gateway-destination-endpoint", RawValue: []byte(f.Endpoint)},
					AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
				}}},
			},
		}},
		DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{"envoy.lb": lb}},
	}
}

// streamedBack returns a body chunk unchanged, as FULL_DUPLEX_STREAMED
// requires of a processor that does not rewrite it.
func streamedBack(b *extprocv3.HttpBody, request bool) *extprocv3.ProcessingResponse {
	br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
		Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
			Body: b.Body, EndOfStream: b.EndOfStream,
		}},
	}}}
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
}

// NewFloorServer returns a gRPC server carrying a FloorProcessor for
// endpoint, on the picker's own transport options (epp.TransportOptions)
// and, with secure, TLS from a self-signed certificate as the picker's
// default: the comparison is only fair if the transports match. Its gRPC
// health service reports "" SERVING.
func NewFloorServer(endpoint string, secure bool) (*grpc.Server, error) {
	opts := epp.TransportOptions()
	if secure {
		cert, err := tlsutil.SelfSigned()
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsutil.ServerConfig(tlsutil.Static(cert)))))
	}
	s := grpc.NewServer(opts...)
	extprocv3.RegisterExternalProcessorServer(s, &FloorProcessor{Endpoint: endpoint})
	healthpb.RegisterHealthServer(s, health.NewServer())
	return s, nil
}
