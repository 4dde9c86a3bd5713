package simulate

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/pkg/tokenize"
)

// The excerpt's requests (testdata/README.md), by index:
//
//	0  line 2    7322 tokens  [0, 14, 15, ..., 26, 27]
//	1  line 31   1477 tokens  [0, 820, 821]
//	2  line 41   1902 tokens  [0, 975, 976, 977]
//	3  line 67   2651 tokens  [0, 1541, 1542, 1543, 1544, 1545]
//	4  line 134  3024 tokens  [0, 1541, 1542, 1543, 1544, 3753]
//	5  line 138  7833 tokens  [0, 14, 15, ..., 26, 3868, 3869]
//	6  line 192  2103 tokens  [0, 820, 5023, 5024, 5025]
//	7  line 262  1902 tokens  [0, 975, 976, 977]
const mooncakeExcerpt = "testdata/mooncake_excerpt.jsonl"

func readExcerpt(t *testing.T) *Trace {
	t.Helper()
	tr, err := ReadTraceFileFormat(mooncakeExcerpt, FormatAuto, 0)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// commonPrefix is how many leading elements a and b share.
func commonPrefix[E comparable](a, b []E) int {
	n := 0
	for n < min(len(a), len(b)) && a[n] == b[n] {
		n++
	}
	return n
}

// TestMooncakeExcerptPrompts builds the excerpt's prompts and checks, by
// values computed by hand from the ids, that two requests whose first k ids
// are equal share exactly k × 512 prompt tokens and no more, and that the
// simulator's block hashes are pkg/tokenize's hashes of those prompts (the
// ones modelsim computes), at the engines' block size and at others.
func TestMooncakeExcerptPrompts(t *testing.T) {
	tr := readExcerpt(t)
	if len(tr.Requests) != 8 || !tr.cacheable {
		t.Fatalf("%d requests, cacheable %t; want 8, true", len(tr.Requests), tr.cacheable)
	}
	wantLen := []int{7322, 1477, 1902, 2651, 3024, 7833, 2103, 1902}
	wantArrival := []int64{0, 9000, 12000, 21000, 48000, 48000, 69000, 90000} // ms
	prompts := make([][]uint32, len(tr.Requests))
	for i := range tr.Requests {
		q := &tr.Requests[i]
		prompts[i] = tr.AppendPrompt(nil, i)
		if len(prompts[i]) != wantLen[i] || q.PromptTokens != wantLen[i] {
			t.Fatalf("request %d: prompt of %d tokens (prompt_tokens %d), want %d", i, len(prompts[i]), q.PromptTokens, wantLen[i])
		}
		if q.Arrival != wantArrival[i]*int64(time.Millisecond) {
			t.Errorf("request %d arrives at %d ns, want %d ms", i, q.Arrival, wantArrival[i])
		}
	}
	if q := tr.Requests[3]; q.OutputTokens != 366 {
		t.Errorf("request 3: %d output tokens, want 366", q.OutputTokens)
	}

	// Tokens, by hand: token o of block j is hash_ids[j]*512 + o.
	for _, tt := range []struct {
		req, pos int
		want     uint32
	}{
		{0, 0, 0},                 // id 0, offset 0
		{0, 511, 511},             // id 0, offset 511
		{0, 512, 14 * 512},        // id 14, offset 0 = 7168
		{3, 2559, 1544*512 + 511}, // 791039: the last token of the shared part
		{3, 2560, 1545 * 512},     // 791040: id 1545 ...
		{4, 2560, 3753 * 512},     // 1921536: ... where request 4 has id 3753
		{3, 2650, 1545*512 + 90},  // 791130: request 3's last token, 91 into a partial block
		{5, 7167, 26*512 + 511},   // 13823
		{5, 7168, 3868 * 512},     // 1980416
		{0, 7168, 27 * 512},       // 13824
		{7, 1901, 977*512 + 365},  // 500589: 365 into the partial last block
	} {
		if got := prompts[tt.req][tt.pos]; got != tt.want {
			t.Errorf("request %d token %d = %d, want %d", tt.req, tt.pos, got, tt.want)
		}
	}

	// Shared prefixes: k equal leading ids share exactly k*512 tokens,
	// unless one prompt ends inside the k-th block.
	for _, tt := range []struct {
		a, b, k, want int
	}{
		{0, 1, 1, 512},   // [0] then 14 vs 820
		{1, 6, 2, 1024},  // [0, 820] then 821 vs 5023
		{3, 4, 5, 2560},  // [0, 1541..1544] then 1545 vs 3753
		{0, 5, 14, 7168}, // [0, 14..26] then 27 vs 3868
		{2, 7, 4, 1902},  // the same ids and length: the whole prompt
		{2, 3, 1, 512},
	} {
		if k := commonPrefix(tr.Requests[tt.a].hashIDs, tr.Requests[tt.b].hashIDs); k != tt.k {
			t.Fatalf("requests %d and %d share %d ids, want %d", tt.a, tt.b, k, tt.k)
		}
		if got := commonPrefix(prompts[tt.a], prompts[tt.b]); got != tt.want {
			t.Errorf("requests %d and %d share %d prompt tokens, want %d (%d ids)", tt.a, tt.b, got, tt.want, tt.k)
		}
		// The blocks hashed at 16 (the engines' default), 512 and 1000
		// tokens: shared exactly as far as whole blocks lie in the shared
		// tokens, and the same hashes as pkg/tokenize's.
		for _, bs := range []int{16, 512, 1000} {
			ha := tr.Requests[tt.a].appendHashes(nil, bs, uint64(tt.a))
			hb := tr.Requests[tt.b].appendHashes(nil, bs, uint64(tt.b))
			if !slices.Equal(ha, tokenize.BlockHashes(prompts[tt.a], bs)) {
				t.Fatalf("request %d at block size %d: the simulator's hashes are not pkg/tokenize's of its prompt", tt.a, bs)
			}
			want := tt.want / bs
			if got := commonPrefix(ha, hb); got != want {
				t.Errorf("requests %d and %d at block size %d share %d block hashes, want %d", tt.a, tt.b, bs, got, want)
			}
		}
	}
}

// TestMooncakeEngineHits replays the excerpt on one server with prefix
// caching: each request's engine hit is its shared prefix with what came
// before, in whole 16-token blocks, below its last token.
func TestMooncakeEngineHits(t *testing.T) {
	c := DefaultConfig()
	c.Trace = mooncakeExcerpt
	s, err := c.Load()
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(s.Trace, s.Fleet, s.Policies[0], c.Options())
	if err != nil {
		t.Fatal(err)
	}
	// 0: nothing before it; 1, 2, 3: block 0 (id 0) of request 0; 4: five
	// blocks of request 3; 5: fourteen of request 0; 6: two of request 1;
	// 7: request 2's prompt, 1902 tokens, of which (1902-1)/16 = 118 whole
	// blocks below the last token.
	want := []uint32{0, 512, 512, 512, 2560, 7168, 1024, 118 * 16}
	var got []uint32
	var cached, prompt int
	for i, o := range res.Outcomes {
		if o.Status != 200 {
			t.Fatalf("request %d status %d", i, o.Status)
		}
		got = append(got, o.EngineCached)
		cached += int(o.EngineCached)
		prompt += s.Trace.Requests[i].PromptTokens
	}
	if !slices.Equal(got, want) {
		t.Fatalf("engine hits %v, want %v", got, want)
	}
	sum := Summarize(s.Trace, res)
	if wantRate := float64(cached) / float64(prompt); sum.PrefixHitRate != wantRate {
		t.Fatalf("prefix hit rate %v, want %v", sum.PrefixHitRate, wantRate)
	}
}

func TestReadMooncakeErrors(t *testing.T) {
	for _, tt := range []struct {
		name, in string
		bs       int
		err      string
	}{
		{"no timestamp", `{"input_length": 1, "output_length": 1, "hash_ids": [0]}`, 512, "line 1: timestamp is required"},
		{"no ids", `{"timestamp": 0, "input_length": 1, "output_length": 1}`, 512, "hash_ids is required"},
		{"no output", `{"timestamp": 0, "input_length": 1, "hash_ids": [0]}`, 512, "output_length is required"},
		{"too few ids", `{"timestamp": 0, "input_length": 513, "output_length": 1, "hash_ids": [0]}`, 512, "1 hash_ids for input_length 513: want 2"},
		{"too many ids", `{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [0, 1]}`, 512, "--trace-block-size"},
		{"negative time", `{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [0]}`, 512, "timestamp -1"},
		{"empty prompt", `{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}`, 512, "input_length 0"},
		{"id too large", `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [8388608]}`, 512, "below 8388608"},
		{"negative id", `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [-1]}`, 512, "line 1"},
		{"second line", "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [0]}\n{", 512, "line 2"},
		{"block size", `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}`, 0, "--trace-block-size 0"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadMooncake(strings.NewReader(tt.in), "m.jsonl", tt.bs)
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("err %v, want %q", err, tt.err)
			}
		})
	}
}

// TestReadMooncakeLine: a line's fields, an output of 0, other fields
// ignored, another block size.
func TestReadMooncakeLine(t *testing.T) {
	tr, err := ReadMooncake(strings.NewReader(
		`{"timestamp": 1.5, "input_length": 5, "output_length": 0, "hash_ids": [7, 9, 11], "session_id": "x"}`), "m", 2)
	if err != nil {
		t.Fatal(err)
	}
	q := tr.Requests[0]
	if q.Arrival != 1_500_000 || q.PromptTokens != 5 || q.OutputTokens != 1 || q.Class != "" {
		t.Fatalf("request %+v", q)
	}
	if got, want := tr.AppendPrompt(nil, 0), []uint32{14, 15, 18, 19, 22}; !slices.Equal(got, want) {
		t.Fatalf("prompt %v, want %v", got, want)
	}
}

// BenchmarkIDHashes is the simulator's cost of hashing a Mooncake
// request's prompt for the picker (7,833 tokens at block size 16).
func BenchmarkIDHashes(b *testing.B) {
	tr, err := ReadTraceFileFormat(mooncakeExcerpt, FormatAuto, 0)
	if err != nil {
		b.Fatal(err)
	}
	q := &tr.Requests[5]
	dst := make([]uint64, 0, 1024)
	b.ReportAllocs()
	b.SetBytes(int64(q.PromptTokens))
	for b.Loop() {
		dst = q.appendHashes(dst[:0], 16, 5)
	}
}
