package replica

import (
	"reflect"
	"testing"

	"github.com/laneway-dev/laneway/pkg/sched/schedtest"
)

// FuzzDecode: no input makes Decode panic or allocate past the limits,
// and a frame it accepts encodes to one that decodes to the same frame.
func FuzzDecode(f *testing.F) {
	f.Add((&Frame{Hello: &Hello{Version: Version, Identity: "x"}}).Append(nil))
	f.Add((&Frame{Tickets: []Ticket{{ID: 1, T: fullTicket()}, {ID: 2, T: schedtest.Ticket().Prompt(5000).Obj()}}}).Append(nil))
	f.Add((&Frame{Releases: []Release{{ID: 3, Event: EventDone}}, Decisions: []Decision{{ID: 1, Kind: KindGrant, Endpoints: []string{"a:1"}}}}).Append(nil))
	f.Fuzz(func(t *testing.T, data []byte) {
		var a Frame
		if err := a.Decode(data); err != nil {
			return
		}
		var b Frame
		if err := b.Decode(a.Append(nil)); err != nil {
			t.Fatalf("a decoded frame does not decode once encoded again: %v", err)
		}
		if !reflect.DeepEqual(normal(&a), normal(&b)) {
			t.Fatalf("frame changed through an encoding:\n%+v\n%+v", a, b)
		}
	})
}

// normal is f's contents by value, for comparison.
func normal(f *Frame) []any {
	out := []any{f.Hello, f.Releases, f.Decisions}
	for _, tk := range f.Tickets {
		out = append(out, tk.ID, *tk.T)
	}
	return out
}
