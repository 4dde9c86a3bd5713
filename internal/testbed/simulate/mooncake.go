package simulate

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sync"

	"github.com/laneway-dev/laneway/pkg/tokenize"
)

// DefaultTraceBlockSize is --trace-block-size's default: the Mooncake
// traces' 512 prompt tokens per hash id.
const DefaultTraceBlockSize = 512

// A Mooncake trace (kvcache-ai/Mooncake's FAST25-release/traces, the format
// NVIDIA Dynamo's router benchmarks and mocker replay) gives no text, only
// each prompt's block ids: hash_ids[j] names the content of prompt tokens
// [j*bs, (j+1)*bs), and equal ids mean equal content. The ids are assigned
// to prefixes, not to blocks on their own, so equal ids at position j also
// mean equal prompts up to there.
//
// A request's prompt is built from its ids so that its blocks are equal
// exactly where the ids are equal: token o of block j is
//
//	hash_ids[j] * bs + o
//
// which is a one-to-one map from (id, offset) to a token id, so two prompts
// agree on a token exactly when they agree on the id of its block (and it
// lies inside both prompts). Two requests whose first k ids are equal and
// whose (k+1)-th differ therefore share exactly their first k*bs tokens,
// whatever block size the engine and the picker hash at. The same prompts
// go to real modelsim processes as token-id arrays (cmd/loadgen --trace),
// so the simulated picker, the simulated engine and the real ones all see
// the same reuse; the simulator hashes these very tokens, so its block
// hashes are the ones modelsim computes.

// mooncakeLine is one line of a Mooncake trace. Other fields are ignored:
// the format has variants that add some (session ids, delays).
type mooncakeLine struct {
	Timestamp    *float64  `json:"timestamp"`
	InputLength  *int      `json:"input_length"`
	OutputLength *int      `json:"output_length"`
	HashIDs      *[]uint64 `json:"hash_ids"`
}

// ReadMooncake reads a Mooncake trace: one JSON object per line with
// timestamp (milliseconds from the trace's start), input_length,
// output_length and hash_ids, one id per blockSize prompt tokens (the last
// one covering the partial last block). An output_length of 0 counts as 1
// (the request still produces its first token). Blank lines are skipped.
// Requests carry no class or tenant: the assignment rules give them one.
func ReadMooncake(r io.Reader, name string, blockSize int) (*Trace, error) {
	if blockSize < 1 {
		return nil, fmt.Errorf("--trace-block-size %d: want >= 1", blockSize)
	}
	// The largest id whose tokens id*bs+o fit in a uint32.
	maxID := (uint64(math.MaxUint32) + 1) / uint64(blockSize)
	t := &Trace{Source: name}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), 64<<20)
	for lineNo := 1; sc.Scan(); lineNo++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var l mooncakeLine
		if err := json.Unmarshal(line, &l); err != nil {
			return nil, fmt.Errorf("trace %s line %d: %w", name, lineNo, err)
		}
		req, err := l.request(blockSize, maxID)
		if err != nil {
			return nil, fmt.Errorf("trace %s line %d: %w", name, lineNo, err)
		}
		t.Requests = append(t.Requests, req)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("trace %s: %w", name, err)
	}
	if err := t.finish(); err != nil {
		return nil, err
	}
	return t, nil
}

func (l *mooncakeLine) request(bs int, maxID uint64) (Request, error) {
	var r Request
	switch {
	case l.Timestamp == nil:
		return r, errors.New("timestamp is required")
	case l.InputLength == nil:
		return r, errors.New("input_length is required")
	case l.OutputLength == nil:
		return r, errors.New("output_length is required")
	case l.HashIDs == nil:
		return r, errors.New("hash_ids is required")
	}
	if ts := *l.Timestamp; ts < 0 || math.IsNaN(ts) || math.IsInf(ts, 0) || ts > math.MaxInt64/1e6 {
		return r, fmt.Errorf("timestamp %v: want a finite number of milliseconds >= 0", ts)
	}
	r.Arrival = int64(math.Round(*l.Timestamp * 1e6))
	if r.PromptTokens = *l.InputLength; r.PromptTokens < 1 {
		return r, fmt.Errorf("input_length %d: want >= 1", r.PromptTokens)
	}
	if *l.OutputLength < 0 {
		return r, fmt.Errorf("output_length %d: want >= 0", *l.OutputLength)
	}
	r.OutputTokens = max(*l.OutputLength, 1)
	ids := *l.HashIDs
	if want := (r.PromptTokens + bs - 1) / bs; len(ids) != want {
		return r, fmt.Errorf("%d hash_ids for input_length %d: want %d, one per %d tokens (is --trace-block-size right?)",
			len(ids), r.PromptTokens, want, bs)
	}
	r.hashIDs = make([]uint32, len(ids))
	for j, id := range ids {
		if id >= maxID {
			return r, fmt.Errorf("hash id %d: at --trace-block-size %d the ids must be below %d (its tokens are id*%[2]d+offset, 32-bit token ids)", id, bs, maxID)
		}
		r.hashIDs[j] = uint32(id)
	}
	r.idBlock = bs
	return r, nil
}

// promptBufs recycles the token buffers the simulator hashes id prompts
// from: a run hashes every admitted request's prompt, and a Mooncake
// prompt averages 12,000 tokens.
var promptBufs = sync.Pool{New: func() any { return new([]uint32) }}

// appendIDHashes appends the block hashes of an id prompt at block size
// bs: pkg/tokenize's hashes of the prompt's tokens, the ones modelsim
// computes for the same prompt sent as token ids.
func (r *Request) appendIDHashes(dst []uint64, bs int) []uint64 {
	buf := promptBufs.Get().(*[]uint32)
	*buf = r.appendIDTokens((*buf)[:0])
	dst = tokenize.AppendBlockHashes(dst, *buf, bs)
	promptBufs.Put(buf)
	return dst
}

// appendIDTokens appends the tokens of an id prompt (see above).
func (r *Request) appendIDTokens(dst []uint32) []uint32 {
	bs := r.idBlock
	n := len(dst)
	dst = slices.Grow(dst, r.PromptTokens)[:n+r.PromptTokens]
	out := dst[n:]
	for j, id := range r.hashIDs {
		base := id * uint32(bs) // ReadMooncake bounds id so that this fits
		blk := out[j*bs : min((j+1)*bs, len(out))]
		for o := range blk {
			blk[o] = base + uint32(o)
		}
	}
	return dst
}
