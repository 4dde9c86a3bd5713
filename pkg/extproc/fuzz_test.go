package extproc

import (
	"context"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// fuzzBytes reads a fuzz input as a sequence of small choices and strings;
// an exhausted input reads as zeros and empty strings.
type fuzzBytes struct{ b []byte }

func (f *fuzzBytes) byte() byte {
	if len(f.b) == 0 {
		return 0
	}
	c := f.b[0]
	f.b = f.b[1:]
	return c
}

// bytes returns the next string of up to 255 bytes (length first).
func (f *fuzzBytes) bytes() []byte {
	n := min(int(f.byte()), len(f.b))
	s := f.b[:n:n]
	f.b = f.b[n:]
	return s
}

// fuzzHeaderNames are the names the stream reads; anything else comes from
// the input.
var fuzzHeaderNames = []string{":path", ":method", "content-length", "Content-Length", "x-laneway-tenant",
	HeaderTestEndpointSelection, "x-laneway-priority", "x-laneway-policy-class"}

// fuzzMessages turns an input into the messages of one stream.
func fuzzMessages(in []byte) []*extprocv3.ProcessingRequest {
	f := &fuzzBytes{in}
	var msgs []*extprocv3.ProcessingRequest
	for len(f.b) > 0 && len(msgs) < 64 {
		var m extprocv3.ProcessingRequest
		switch op := f.byte(); op % 8 {
		case 0, 1:
			h := &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{}, EndOfStream: op&8 != 0}
			for range f.byte() % 6 {
				hv := &corev3.HeaderValue{Key: fuzzHeaderNames[int(f.byte())%len(fuzzHeaderNames)]}
				if k := f.byte(); k%4 == 0 {
					hv.Key = string(f.bytes())
				}
				if f.byte()%2 == 0 {
					hv.RawValue = f.bytes()
				} else {
					hv.Value = string(f.bytes())
				}
				h.Headers.Headers = append(h.Headers.Headers, hv)
			}
			if op%8 == 1 {
				m.Request = &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: h}
				break
			}
			m.Request = &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: h}
			switch f.byte() % 5 {
			case 1: // the subset hint as a comma string
				m.MetadataContext = subsetMetadata(structpb.NewStringValue(string(f.bytes())))
			case 2: // as a list, with an entry that is no string
				m.MetadataContext = subsetMetadata(structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{
					structpb.NewStringValue(string(f.bytes())), structpb.NewNumberValue(float64(f.byte())), structpb.NewStringValue(string(f.bytes()))}}))
			case 3: // another kind altogether
				m.MetadataContext = subsetMetadata(structpb.NewBoolValue(true))
			case 4: // an identity claim, nested or not, of any kind
				inner := &structpb.Struct{Fields: map[string]*structpb.Value{string(f.bytes()): structpb.NewStringValue(string(f.bytes()))}}
				outer := map[string]*structpb.Value{string(f.bytes()): structpb.NewStructValue(inner), "sub": structpb.NewNumberValue(float64(f.byte()))}
				m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"jwt": {Fields: outer}}}
			}
		case 2, 3:
			b := &extprocv3.HttpBody{Body: f.bytes(), EndOfStream: op&8 != 0}
			if op%8 == 2 {
				m.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: b}
			} else {
				m.Request = &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: b}
			}
		case 4:
			m.Request = &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}
		case 5:
			m.Request = &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}
		case 6:
			// no request at all
		case 7:
			modes := []filterv3.ProcessingMode_BodySendMode{filterv3.ProcessingMode_NONE, filterv3.ProcessingMode_STREAMED,
				filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_BUFFERED_PARTIAL, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, 99}
			m.ProtocolConfig = &extprocv3.ProtocolConfiguration{
				RequestBodyMode:  modes[int(f.byte())%len(modes)],
				ResponseBodyMode: modes[int(f.byte())%len(modes)],
			}
			m.ObservabilityMode = op&8 != 0
			m.Request = &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{EndOfStream: op&16 != 0}}
		}
		msgs = append(msgs, &m)
	}
	return msgs
}

func subsetMetadata(v *structpb.Value) *corev3.Metadata {
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		MetadataNamespaceSubset: {Fields: map[string]*structpb.Value{MetadataKeySubset: v}}}}
}

// FuzzStream plays any sequence of gateway messages (headers with any
// names and values, the subset hint in every form, identity metadata
// read as the picker reads it, bodies, trailers,
// protocol configurations, messages out of order) into a stream of a
// server with small limits. The stream ends without a panic, answers
// with at most one immediate response, and gives back every held byte.
func FuzzStream(f *testing.F) {
	f.Add([]byte{0, 2, 2, 3, '1', '0', '0', 0, 0, 2, 3, 'a', 'b', 'c', 1, 3})
	f.Add([]byte{8, 1, 5, 0, 9, '1', '0', '.', '0', '.', '0', '.', '1', 1, 9, 'a'})
	f.Add([]byte{7, 2, 4, 8, 1, 2, 0, 2, 'x', 'y', 0, 10, 3, '{', '}', 0})
	f.Add([]byte{0, 1, 2, 0, 5, '9', '9', '9', '9', '9', 0, 2, 1, 'x', 2, 1, 'y', 10, 2, 'z', 'w'})
	f.Fuzz(func(t *testing.T, in []byte) {
		s := NewServer(decideFunc(func(_ context.Context, r *Request) (Decision, error) {
			// The identity's reads of the forwarded metadata.
			for _, path := range [][]string{{"sub"}, {"claims", "sub"}, {"a", "b", "c"}, nil} {
				if v, ok := r.MetadataString("jwt", path); ok && len(path) == 0 {
					t.Errorf("MetadataString with no path gave %q", v)
				}
			}
			if r.HasSubset && len(r.Subset) > 0 {
				return Decision{Endpoints: r.Subset[:1]}, nil
			}
			return Decision{Endpoints: []string{"10.0.0.1:8000"}}, nil
		}), Options{MaxBodyBytes: 512, MaxHeldBodyBytes: 1024, MaxHeaderBytes: 256, ConformanceHooks: true})
		sc := &script{msgs: fuzzMessages(in), s: s, onEnd: func() {}}
		_ = s.Process(sc)
		immediate := 0
		for _, m := range sc.sent {
			if m.GetImmediateResponse() != nil {
				immediate++
			}
		}
		if immediate > 1 {
			t.Errorf("%d immediate responses on one stream", immediate)
		}
		if s.HeldBodyBytes() != 0 || s.HeldHeaderBytes() != 0 {
			t.Errorf("after the stream: held body %d, headers %d; want 0", s.HeldBodyBytes(), s.HeldHeaderBytes())
		}
	})
}
