package replica

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/laneway-dev/laneway/pkg/policy"
	"github.com/laneway-dev/laneway/pkg/sched/schedtest"
)

// TestEncodingMatchesTheSchema decodes the hand encoding with a real
// protobuf decoder built from replica.proto, and checks every field by
// its name in the schema: the Go code and the schema cannot drift apart.
func TestEncodingMatchesTheSchema(t *testing.T) {
	frameDesc := loadSchema(t)

	tk := fullTicket()
	f := Frame{
		Hello:    &Hello{Version: Version, Identity: "epp-0_10.0.0.1:9004_ab"},
		Tickets:  []Ticket{{ID: 42, T: tk}, {ID: 43, T: schedtest.Ticket().Prompt(32 * 1024).Obj()}},
		Releases: []Release{{ID: 42, Event: EventDone}},
		Decisions: []Decision{{ID: 42, Kind: KindReply, Endpoints: []string{"a:1"}, Engine: policy.EngineTRTLLM, Priority: -2,
			Cached: 9, Class: 3, Status: 429, Reason: "shed", Message: "m", Body: []byte("{}"), RetryAfter: time.Second, Queued: true,
			Prefiller: "10.0.0.9:8000"}},
	}
	msg := dynamicpb.NewMessage(frameDesc)
	if err := (proto.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(f.Append(nil), msg); err != nil {
		t.Fatalf("the schema's decoder refuses the encoding: %v", err)
	}
	if u := msg.GetUnknown(); len(u) > 0 {
		t.Fatalf("%d bytes of the encoding are unknown to the schema", len(u))
	}
	get := func(m protoreflect.Message, name string) protoreflect.Value {
		t.Helper()
		fd := m.Descriptor().Fields().ByName(protoreflect.Name(name))
		if fd == nil {
			t.Fatalf("%s has no field %s", m.Descriptor().Name(), name)
		}
		return m.Get(fd)
	}
	hello := get(msg, "hello").Message()
	tickets := get(msg, "tickets").List()
	ticket := tickets.Get(0).Message()
	release := get(msg, "releases").List().Get(0).Message()
	decision := get(msg, "decisions").List().Get(0).Message()
	long := tickets.Get(1).Message()
	checks := []struct {
		name      string
		got, want any
	}{
		{"hello.version", get(hello, "version").Uint(), uint64(Version)},
		{"hello.identity", get(hello, "identity").String(), "epp-0_10.0.0.1:9004_ab"},
		{"ticket.id", get(ticket, "id").Uint(), uint64(42)},
		{"ticket.model", get(ticket, "model").String(), tk.Model},
		{"ticket.class_header", get(ticket, "class_header").String(), tk.ClassHeader},
		{"ticket.raw_isl", get(ticket, "raw_isl").Uint(), tk.RawISL},
		{"ticket.cached", get(ticket, "cached").Uint(), tk.Cached},
		{"ticket.priority", get(ticket, "priority").Int(), int64(tk.Priority)},
		{"ticket.strict", get(ticket, "strict").Uint(), uint64(tk.Strict)},
		{"ticket.has_priority", get(ticket, "has_priority").Bool(), true},
		{"ticket.block_size", get(ticket, "block_size").Uint(), uint64(tk.BlockSize)},
		{"ticket.block_count", get(ticket, "block_count").Uint(), uint64(len(tk.Blocks))},
		{"ticket.blocks[0]", get(ticket, "blocks").List().Get(0).Uint(), tk.Blocks[0]},
		{"ticket.allow[1]", get(ticket, "allow").List().Get(1).String(), tk.Allow[1]},
		{"ticket.has_allow", get(ticket, "has_allow").Bool(), true},
		{"ticket.rank_lo", get(ticket, "rank_lo").Int(), int64(tk.RankLo)},
		{"ticket.rank_hi", get(ticket, "rank_hi").Int(), int64(tk.RankHi)},
		{"ticket.has_ranks", get(ticket, "has_ranks").Bool(), true},
		{"ticket.tenant", get(ticket, "tenant").String(), tk.Tenant},
		{"ticket.waited_nanos", get(ticket, "waited_nanos").Uint(), uint64(tk.Waited)},
		{"ticket.output_tokens", get(ticket, "output_tokens").Uint(), tk.OutputTokens},
		{"long ticket's hashes", get(long, "blocks").List().Len(), 226},
		{"release.id", get(release, "id").Uint(), uint64(42)},
		{"release.event", get(release, "event").Uint(), uint64(EventDone)},
		{"decision.kind", get(decision, "kind").Uint(), uint64(KindReply)},
		{"decision.endpoints[0]", get(decision, "endpoints").List().Get(0).String(), "a:1"},
		{"decision.engine", get(decision, "engine").Uint(), uint64(2)}, // the schema's trtllm
		{"decision.priority", get(decision, "priority").Int(), int64(-2)},
		{"decision.cached", get(decision, "cached").Uint(), uint64(9)},
		{"decision.class", get(decision, "class").Uint(), uint64(3)},
		{"decision.status", get(decision, "status").Uint(), uint64(429)},
		{"decision.reason", get(decision, "reason").String(), "shed"},
		{"decision.message", get(decision, "message").String(), "m"},
		{"decision.body", string(get(decision, "body").Bytes()), "{}"},
		{"decision.retry_after_nanos", get(decision, "retry_after_nanos").Uint(), uint64(time.Second)},
		{"decision.queued", get(decision, "queued").Bool(), true},
		{"decision.prefiller", get(decision, "prefiller").String(), "10.0.0.9:8000"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	// The engines' numbers are the schema's.
	for e, n := range map[policy.Engine]uint64{policy.EngineVLLM: 0, policy.EngineSGLang: 1, policy.EngineTRTLLM: 2} {
		if uint64(e) != n {
			t.Errorf("engine %s is %d in Go, %d in the schema", e, uint64(e), n)
		}
	}
}

// loadSchema reads replica.proto, with a parser for exactly the subset it
// uses (messages of scalar, message and repeated fields), into a
// descriptor, and returns the Frame message.
func loadSchema(t *testing.T) protoreflect.MessageDescriptor {
	t.Helper()
	src, err := os.ReadFile("replica.proto")
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for _, line := range strings.Split(string(src), "\n") {
		if i := strings.Index(line, "//"); i >= 0 {
			line = line[:i]
		}
		text.WriteString(line + "\n")
	}
	scalars := map[string]descriptorpb.FieldDescriptorProto_Type{
		"uint32": descriptorpb.FieldDescriptorProto_TYPE_UINT32, "uint64": descriptorpb.FieldDescriptorProto_TYPE_UINT64,
		"sint32": descriptorpb.FieldDescriptorProto_TYPE_SINT32, "bool": descriptorpb.FieldDescriptorProto_TYPE_BOOL,
		"string": descriptorpb.FieldDescriptorProto_TYPE_STRING, "bytes": descriptorpb.FieldDescriptorProto_TYPE_BYTES,
		"fixed64": descriptorpb.FieldDescriptorProto_TYPE_FIXED64,
	}
	pkg := regexp.MustCompile(`package\s+([\w.]+);`).FindStringSubmatch(text.String())[1]
	file := &descriptorpb.FileDescriptorProto{Name: proto.String("replica.proto"), Package: proto.String(pkg), Syntax: proto.String("proto3")}
	msgRE := regexp.MustCompile(`(?s)message\s+(\w+)\s*\{(.*?)\}`)
	fieldRE := regexp.MustCompile(`(repeated\s+)?(\w+)\s+(\w+)\s*=\s*(\d+);`)
	for _, m := range msgRE.FindAllStringSubmatch(text.String(), -1) {
		md := &descriptorpb.DescriptorProto{Name: proto.String(m[1])}
		for _, f := range fieldRE.FindAllStringSubmatch(m[2], -1) {
			var num int32
			for _, c := range f[4] {
				num = num*10 + int32(c-'0')
			}
			fd := &descriptorpb.FieldDescriptorProto{Name: proto.String(f[3]), Number: proto.Int32(num),
				Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(), JsonName: proto.String(f[3])}
			if f[1] != "" {
				fd.Label = descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum()
			}
			if typ, ok := scalars[f[2]]; ok {
				fd.Type = typ.Enum()
			} else {
				fd.Type = descriptorpb.FieldDescriptorProto_TYPE_MESSAGE.Enum()
				fd.TypeName = proto.String("." + pkg + "." + f[2])
			}
			md.Field = append(md.Field, fd)
		}
		file.MessageType = append(file.MessageType, md)
	}
	fd, err := protodesc.NewFile(file, nil)
	if err != nil {
		t.Fatalf("replica.proto as parsed: %v", err)
	}
	frame := fd.Messages().ByName("Frame")
	if frame == nil || fd.Messages().Len() != 5 {
		t.Fatalf("replica.proto: %d messages parsed, want Frame, Hello, Ticket, Release, Decision", fd.Messages().Len())
	}
	return frame
}
