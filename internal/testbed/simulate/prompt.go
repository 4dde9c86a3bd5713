package simulate

import (
	"hash/fnv"

	"github.com/laneway-dev/laneway/pkg/tokenize"
)

// A simulated prompt has no text unless the trace gives one, only a
// length and a prefix group. Its block hashes are chained like
// pkg/tokenize's, over block contents that stand for "block i of the
// group's shared prefix" or "block i of this request's own text", so two
// prompts share exactly their common group prefix, and the picker's index
// and the engine's cache see the same hashes.

// mix is splitmix64's finaliser: a cheap, well-spread 64-bit hash step.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// groupKey names a prefix group.
func groupKey(g string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(g))
	return h.Sum64() | 1 // never 0, which stands for "own text"
}

// appendHashes appends the chained hashes of the request's full prompt
// blocks at block size bs. own distinguishes the request's own text from
// every other request's (its index in the trace).
func (r *Request) appendHashes(dst []uint64, bs int, own uint64) []uint64 {
	if r.hashIDs != nil {
		return r.appendIDHashes(dst, bs)
	}
	if r.tokens != nil {
		return tokenize.AppendBlockHashes(dst, r.tokens, bs)
	}
	shared := 0
	var g uint64
	if r.PrefixGroup != "" {
		g = groupKey(r.PrefixGroup)
		shared = r.PrefixTokens
		if shared == 0 || shared > r.PromptTokens {
			shared = r.PromptTokens
		}
	}
	h := uint64(0x27d4eb2f165667c5) ^ uint64(bs)
	for i := 0; (i+1)*bs <= r.PromptTokens; i++ {
		var content uint64
		if (i+1)*bs <= shared {
			content = mix(g ^ uint64(i)*0x9e3779b97f4a7c15)
		} else {
			content = mix(^own ^ uint64(i)*0xc2b2ae3d27d4eb4f)
		}
		h = mix(h ^ content)
		dst = append(dst, h)
	}
	return dst
}
