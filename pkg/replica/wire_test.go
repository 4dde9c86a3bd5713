package replica

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/laneway-dev/laneway/pkg/affinity"
	"github.com/laneway-dev/laneway/pkg/policy"
	"github.com/laneway-dev/laneway/pkg/sched"
	"github.com/laneway-dev/laneway/pkg/sched/schedtest"
)

// fullTicket sets every field the link carries.
func fullTicket() *sched.Ticket {
	t := schedtest.Ticket().Prompt(1000).Shared(300).Obj()
	t.Model, t.ClassHeader, t.Tenant = "llama", "premium", "team-a"
	t.Cached, t.Priority, t.Strict, t.HasPriority = 7, -5, 2, true
	t.Allow, t.HasAllow = []string{"10.0.0.1:8000", "10.0.0.2"}, true
	t.RankLo, t.RankHi, t.HasRanks = 1, 3, true
	t.Waited = 1500 * time.Millisecond
	t.OutputTokens = 300
	return t
}

// sparse is t with its chain as the leader rebuilds it: the hashes the
// index reads, zero elsewhere.
func sparse(t *sched.Ticket) *sched.Ticket {
	s := *t
	if len(t.Blocks) == 0 {
		return &s
	}
	s.Blocks = make([]uint64, len(t.Blocks))
	forSparse(len(t.Blocks), sched.CacheableBlocks(t.RawISL, len(t.Blocks), t.BlockSize), func(p int) { s.Blocks[p] = t.Blocks[p] })
	return &s
}

func TestFrameRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		f    Frame
	}{
		{"hello", Frame{Hello: &Hello{Version: Version, Identity: "epp-0_10.0.0.1:9004_ab12"}}},
		{"tickets", Frame{Tickets: []Ticket{
			{ID: 1, T: fullTicket()},
			{ID: 2, T: &sched.Ticket{Model: "m"}},                             // no prompt hashed
			{ID: 3, T: &sched.Ticket{HasAllow: true, Allow: []string{}}},      // an empty allow-list answers 503
			{ID: 4, T: schedtest.Ticket().Prompt(32 * 1024).Obj()},            // a long prompt, sparse
			{ID: 5, T: schedtest.Ticket().Prompt(17).BlockSize(16).Obj()},     // one block, not cacheable
			{ID: 6, T: schedtest.Ticket().Prompt(32).BlockSize(16).Obj()},     // two blocks, one cacheable
			{ID: 7, T: schedtest.Ticket().Prompt(1 << 12).BlockSize(1).Obj()}, // last cacheable off the grid
		}}},
		{"releases", Frame{Releases: []Release{{ID: 1, Event: EventFirstByte}, {ID: 1, Event: EventDone}, {ID: 9, Event: EventCancel}}}},
		{"decisions", Frame{Decisions: []Decision{
			{ID: 1, Kind: KindGrant, Endpoints: []string{"10.0.0.1:8000", "10.0.0.2:8000"}, Engine: policy.EngineSGLang, Priority: -3, Cached: 512, Class: 2, Queued: true},
			{ID: 2, Kind: KindReply, Status: 429, Reason: "queue_limit", Message: "full", Body: []byte(`{"error":"full"}`), RetryAfter: 3 * time.Second},
			{ID: 3, Kind: KindRetry, Reason: "shutting_down"},
			{ID: 4, Kind: KindGrant, Endpoints: []string{"10.0.1.1:8000"}, Prefiller: "10.0.2.1:8000"}, // disaggregated
		}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got Frame
			if err := got.Decode(tt.f.Append(nil)); err != nil {
				t.Fatal(err)
			}
			want := tt.f
			for i := range want.Tickets {
				want.Tickets[i].T = sparse(want.Tickets[i].T)
			}
			if !reflect.DeepEqual(&got, &want) {
				t.Errorf("decoded\n%+v\nwant\n%+v", got, want)
			}
			for i := range got.Tickets {
				if !reflect.DeepEqual(got.Tickets[i].T, want.Tickets[i].T) {
					t.Errorf("ticket %d decoded\n%+v\nwant\n%+v", i, got.Tickets[i].T, want.Tickets[i].T)
				}
			}
		})
	}
}

func TestDecodeRefusesInconsistentBlocks(t *testing.T) {
	// ticket encodes a ticket message by hand: 16 blocks of 16 tokens for
	// a 256-token prompt (15 cacheable: all 16 positions are on the grid),
	// with the given number of hashes.
	ticket := func(count, blockSize, hashes int) []byte {
		var b []byte
		b = appendVarint(b, ticketID, 1)
		b = appendVarint(b, ticketRawISL, 256)
		b = appendVarint(b, ticketBlockSize, uint64(blockSize))
		b = appendVarint(b, ticketBlockCount, uint64(count))
		b = protowire.AppendTag(b, ticketBlocks, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(8*hashes))
		for i := range hashes {
			b = protowire.AppendFixed64(b, uint64(i+1))
		}
		return appendMessage(nil, frameTickets, b)
	}
	good := ticket(16, 16, 16)
	var f Frame
	if err := f.Decode(good); err != nil || len(f.Tickets) != 1 || len(f.Tickets[0].T.Blocks) != 16 {
		t.Fatalf("the well-formed ticket: %v, %+v", err, f)
	}
	for name, data := range map[string][]byte{
		"truncated":           good[:len(good)-3],
		"a hash missing":      ticket(16, 16, 15),
		"a hash too many":     ticket(16, 16, 17),
		"no block size":       ticket(16, 0, 16),
		"an absurd count":     ticket(MaxBlocks+1, 16, 16),
		"hashes but no count": ticket(0, 16, 16),
	} {
		if err := f.Decode(data); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: Decode = %v, want ErrMalformed", name, err)
		}
	}
}

// TestSparseSizes reports the bytes of a ticket at the prompt lengths of
// docs/scaling.md, and checks the sparse chain's hash count.
func TestSparseSizes(t *testing.T) {
	for _, tc := range []struct {
		tokens, hashes int
	}{
		{256, 16},
		{32 * 1024, 224 + 2}, // the grid's 224 positions below 2,048, the last cacheable block and the last block
	} {
		tk := schedtest.Ticket().Prompt(tc.tokens).Obj()
		tk.Model, tk.Tenant = "meta-llama/Llama-3.1-8B-Instruct", "team-a"
		if got := sparseCount(len(tk.Blocks), sched.CacheableBlocks(tk.RawISL, len(tk.Blocks), tk.BlockSize)); got != tc.hashes {
			t.Errorf("%d tokens: %d hashes sent, want %d", tc.tokens, got, tc.hashes)
		}
		b := (&Frame{Tickets: []Ticket{{ID: 1 << 20, T: tk}}}).Append(nil)
		t.Logf("%d-token ticket: %d blocks, %d hashes sent, %d bytes on the wire (whole chain: %d bytes)",
			tc.tokens, len(tk.Blocks), tc.hashes, len(b), 8*len(tk.Blocks))
	}
	// What comes back for each ticket: a grant with one fallback, and
	// the first byte's and the done's release events.
	grant := AppendDecision(nil, &Decision{ID: 1 << 20, Kind: KindGrant, Endpoints: []string{"10.244.12.34:8000", "10.244.12.35:8000"},
		Engine: policy.EngineVLLM, Cached: 4096, Class: 1})
	releases := AppendRelease(AppendRelease(nil, 1<<20, EventFirstByte), 1<<20, EventDone)
	t.Logf("a grant with one fallback: %d bytes; its two release events: %d bytes", len(grant), len(releases))
	if len(grant) > 64 || len(releases) > 20 {
		t.Errorf("grant %d bytes, releases %d bytes: want at most 64 and 20", len(grant), len(releases))
	}
}

// TestVersionCoversTheGrid pins the sparse grid this Version sends: a
// change of pkg/affinity's grid must come with a new Version, or a
// follower and a leader of different builds would read different
// positions of the same ticket.
func TestVersionCoversTheGrid(t *testing.T) {
	var sum uint64
	for p := 0; p < 1<<20; p += affinity.GridStride(p) {
		sum = sum*31 + uint64(p)
	}
	const gridV1 uint64 = 12895544359528955904 // the grid of Version 1
	if Version == 1 && sum != gridV1 {
		t.Fatalf("pkg/affinity's grid changed (fingerprint %d, version 1 sent %d): raise replica.Version and pin the new grid", sum, gridV1)
	}
}

// TestItemsMakeAFrame: items appended one by one, with their lengths sized
// in place, are the frame's encoding.
func TestItemsMakeAFrame(t *testing.T) {
	long := schedtest.Ticket().Prompt(32 * 1024).Obj() // an item longer than 127 bytes
	d := Decision{ID: 2, Kind: KindGrant, Endpoints: []string{"a:1"}}
	var raw []byte
	raw = AppendTicket(raw, 1, long)
	raw = AppendTicket(raw, 3, &sched.Ticket{})
	raw = AppendRelease(raw, 1, EventFirstByte)
	raw = AppendDecision(raw, &d)
	want := Frame{Tickets: []Ticket{{ID: 1, T: long}, {ID: 3, T: &sched.Ticket{}}}, Releases: []Release{{ID: 1, Event: EventFirstByte}}, Decisions: []Decision{d}}
	if got := want.Append(nil); string(got) != string(raw) {
		t.Fatalf("items encode to %d bytes, the frame to %d", len(raw), len(got))
	}
}
