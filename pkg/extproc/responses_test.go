package extproc

import (
	"maps"
	"strconv"
	"sync"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// plainPick builds a pick answer message by message, the obvious way; the
// single-allocation builder must produce exactly this.
func plainPick(header, list string, newLen int, replace []byte, onBody bool) *extprocv3.ProcessingResponse {
	set := []*corev3.HeaderValueOption{setHeader(HeaderDestinationEndpoint, header)}
	if newLen >= 0 {
		set = append(set, setHeader("content-length", strconv.Itoa(newLen)))
	}
	common := &extprocv3.CommonResponse{ClearRouteCache: true, HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: set}}
	if onBody && replace != nil {
		common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: replace}}
	}
	resp := &extprocv3.ProcessingResponse{DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		MetadataNamespaceLB: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			MetadataKeyDestination: structpb.NewStringValue(list),
		}}),
	}}}
	if onBody {
		resp.Response = &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: common}}
	} else {
		resp.Response = &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common}}
	}
	return resp
}

func TestPickResponseMatchesPlainBuild(t *testing.T) {
	tests := []struct {
		name         string
		header, list string
		newLen       int
		replace      []byte
		onBody       bool
	}{
		{"headers answer", "10.0.0.1:8000", "10.0.0.1:8000", -1, nil, false},
		{"headers answer with fallbacks, pick-only header", "10.0.0.1:8000", "10.0.0.1:8000,10.0.0.2:8000", -1, nil, false},
		{"headers answer with content-length", "10.0.0.1:8000", "10.0.0.1:8000", 21, nil, false},
		{"zero content-length", "10.0.0.1:8000", "10.0.0.1:8000", 0, nil, false},
		{"buffered body answer", "10.0.0.4:8000", "10.0.0.4:8000", -1, nil, true},
		{"buffered body answer with replacement", "10.0.0.4:8000", "10.0.0.4:8000", 11, []byte(`{"a":12345}`), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := pickResponse(tc.header, tc.list, tc.newLen, tc.replace, tc.onBody)
			want := plainPick(tc.header, tc.list, tc.newLen, tc.replace, tc.onBody)
			if !proto.Equal(got, want) {
				t.Errorf("pickResponse = %v\nwant %v", got, want)
			}
		})
	}
}

func TestStreamedBodyMatchesPlainBuild(t *testing.T) {
	tests := []struct {
		name         string
		chunk        []byte
		eos, request bool
	}{
		{"request chunk", []byte("abc"), false, true},
		{"last request chunk", []byte("abc"), true, true},
		{"empty last request chunk", nil, true, true},
		{"response chunk", []byte("data: x\n\n"), false, false},
		{"last response chunk", []byte("data: [DONE]\n\n"), true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			common := &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
				Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
					Body: tc.chunk, EndOfStream: tc.eos,
				}},
			}}
			want := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
				ResponseBody: &extprocv3.BodyResponse{Response: common},
			}}
			if tc.request {
				want = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
					RequestBody: &extprocv3.BodyResponse{Response: common},
				}}
			}
			if got := streamedBody(tc.chunk, tc.eos, tc.request); !proto.Equal(got, want) {
				t.Errorf("streamedBody = %v\nwant %v", got, want)
			}
		})
	}
}

// TestSharedPickAnswer checks the cached answer: the same message for the
// same endpoint, the same bytes on the wire as the plain build, decoding
// to its content, and safe to marshal from many streams at once (run with
// -race).
func TestSharedPickAnswer(t *testing.T) {
	s := NewServer(nil, Options{})
	a := s.pickAnswer("10.0.0.1:8000")
	if b := s.pickAnswer("10.0.0.1:8000"); b != a {
		t.Error("second pick of the same endpoint built a new answer")
	}
	plain := plainPick("10.0.0.1:8000", "10.0.0.1:8000", -1, nil, false)
	want, err := proto.Marshal(plain)
	if err != nil {
		t.Fatal(err)
	}
	got, err := proto.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("shared answer encodes to %x, the plain build to %x", got, want)
	}
	var decoded extprocv3.ProcessingResponse
	if err := proto.Unmarshal(got, &decoded); err != nil || !proto.Equal(&decoded, plain) {
		t.Errorf("shared answer decodes to %v (%v), want %v", &decoded, err, plain)
	}
	other, err := proto.Marshal(s.pickAnswer("10.0.0.2:8000"))
	if err != nil || string(other) == string(got) {
		t.Errorf("another endpoint got the first endpoint's answer (%v)", err)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for range 8 {
		wg.Go(func() {
			for range 100 {
				if proto.Size(a) != len(want) {
					errs <- "concurrent size differs"
					return
				}
				b, err := proto.Marshal(a)
				if err != nil || string(b) != string(want) {
					errs <- "concurrent marshal differs or failed"
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	for i := range maxCachedPicks + 1 {
		s.pickAnswer("10.1." + strconv.Itoa(i/250) + "." + strconv.Itoa(i%250) + ":8000")
	}
	if n := len(s.picks); n > maxCachedPicks {
		t.Errorf("cache holds %d answers, bound is %d", n, maxCachedPicks)
	}
}

func TestHeaderMap(t *testing.T) {
	hv := func(k, raw, v string) *corev3.HeaderValue {
		h := &corev3.HeaderValue{Key: k, Value: v}
		if raw != "" {
			h.RawValue = []byte(raw)
		}
		return h
	}
	tests := []struct {
		name string
		in   []*corev3.HeaderValue
		want map[string]string
	}{
		{"none", nil, map[string]string{}},
		{"raw values", []*corev3.HeaderValue{hv(":path", "/v1/completions", ""), hv("content-length", "1234", "")},
			map[string]string{":path": "/v1/completions", "content-length": "1234"}},
		{"value when raw_value is empty", []*corev3.HeaderValue{hv("a", "", "old"), hv("b", "new", "ignored")},
			map[string]string{"a": "old", "b": "new"}},
		{"names lower-cased, first value wins", []*corev3.HeaderValue{hv("X-User", "u1", ""), hv("x-user", "u2", ""), hv("x-empty", "", "")},
			map[string]string{"x-user": "u1", "x-empty": ""}},
		{"values after a duplicate keep their own bytes", []*corev3.HeaderValue{hv("a", "1", ""), hv("a", "22", ""), hv("b", "333", "")},
			map[string]string{"a": "1", "b": "333"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := headerMap(&corev3.HeaderMap{Headers: tc.in})
			if !maps.Equal(got, tc.want) {
				t.Errorf("headerMap = %v, want %v", got, tc.want)
			}
		})
	}
}
