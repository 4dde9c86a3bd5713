package replica

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
)

// The gRPC service of the link: one bidirectional stream of Frames,
// carried by the codec below rather than by generated code.
const (
	// ServiceName is the service as replica.proto names it.
	ServiceName = "laneway.replica.v1.Replica"
	// LinkMethod is the full method name of the link stream.
	LinkMethod = "/" + ServiceName + "/Link"
	// CodecName is the codec's gRPC content subtype
	// (application/grpc+laneway-replica).
	CodecName = "laneway-replica"
)

func init() {
	encoding.RegisterCodec(codec{}) // registration is only allowed in init
}

// codec carries *Frame values in their wire format.
type codec struct{}

// Marshal implements encoding.Codec.
func (codec) Marshal(v any) ([]byte, error) {
	switch f := v.(type) {
	case *Frame:
		return f.Append(nil), nil
	case Raw:
		return f, nil
	}
	return nil, fmt.Errorf("replica codec: cannot marshal %T", v)
}

// Unmarshal implements encoding.Codec.
func (codec) Unmarshal(data []byte, v any) error {
	f, ok := v.(*Frame)
	if !ok {
		return fmt.Errorf("replica codec: cannot unmarshal into %T", v)
	}
	return f.Decode(data)
}

// Name implements encoding.Codec.
func (codec) Name() string { return CodecName }

// LinkServer is the leader's side of the link.
type LinkServer interface {
	// Link serves one follower's stream until it ends; its messages are
	// Frames (RecvMsg and SendMsg take *Frame).
	Link(grpc.ServerStream) error
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: ServiceName,
	HandlerType: (*LinkServer)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "Link",
		Handler:       func(srv any, stream grpc.ServerStream) error { return srv.(LinkServer).Link(stream) },
		ServerStreams: true,
		ClientStreams: true,
	}},
	Metadata: "pkg/replica/replica.proto",
}

// Register registers srv's link service on s.
func Register(s grpc.ServiceRegistrar, srv LinkServer) { s.RegisterService(&serviceDesc, srv) }

// OpenLink opens a link stream on cc: its messages are Frames.
func OpenLink(ctx context.Context, cc grpc.ClientConnInterface, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	opts = append(opts, grpc.CallContentSubtype(CodecName))
	return cc.NewStream(ctx, &serviceDesc.Streams[0], LinkMethod, opts...)
}
