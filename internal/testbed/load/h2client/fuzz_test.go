package h2client

import (
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// FuzzResponseKind checks the hand-rolled wire scan against the protobuf
// library: whenever a ProcessingResponse decodes with a response set,
// responseKind names the same field, and an immediate response's status
// reads the same code. Nothing may panic on any input.
func FuzzResponseKind(f *testing.F) {
	seeds := []*extprocv3.ProcessingResponse{
		{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}},
		{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}},
		{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
			Status: &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests}, Body: []byte(`{"error":"x"}`),
		}}},
	}
	for _, m := range seeds {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x42, 0x00, 0x3a, 0x02, 0x0a, 0x00})
	f.Fuzz(func(t *testing.T, msg []byte) {
		field, val, err := responseKind(msg)
		var status int
		var statusErr error
		if err == nil && field == fieldImmediate {
			status, statusErr = immediateStatus(val)
		}
		var m extprocv3.ProcessingResponse
		if proto.Unmarshal(msg, &m) != nil {
			return
		}
		oneof := m.ProtoReflect().WhichOneof(m.ProtoReflect().Descriptor().Oneofs().ByName("response"))
		if oneof == nil {
			return
		}
		// The library keeps the last occurrence of a oneof; the scan takes
		// the first. They agree when the message carries one response, as
		// every real one does.
		if countResponses(msg) != 1 {
			return
		}
		if err != nil || int(field) != int(oneof.Number()) {
			t.Fatalf("responseKind = %d, %v; the library decodes field %d", field, err, oneof.Number())
		}
		if field == fieldImmediate && statusErr == nil {
			if want := int(m.GetImmediateResponse().GetStatus().GetCode()); status != want {
				t.Fatalf("immediateStatus = %d, the library decodes %d", status, want)
			}
		}
	})
}

// countResponses counts the top-level members of the response oneof in
// msg.
func countResponses(msg []byte) int {
	n := 0
	for len(msg) > 0 {
		num, typ, l := protowire.ConsumeTag(msg)
		if l < 0 {
			return -1
		}
		msg = msg[l:]
		m := protowire.ConsumeFieldValue(num, typ, msg)
		if m < 0 {
			return -1
		}
		if isResponseField(num) && typ == protowire.BytesType {
			n++
		}
		msg = msg[m:]
	}
	return n
}
