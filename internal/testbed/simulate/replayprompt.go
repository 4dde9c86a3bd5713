package simulate

// AppendPrompt appends request i's prompt as token ids: the prompt a real
// replay sends to modelsim (cmd/loadgen --trace), with the reuse the
// simulator models. Two prompts share a block of tokens exactly when the
// simulator's picker and engines see them share it:
//
//   - a Mooncake request: its tokens are built from its hash ids
//     (mooncake.go), the very tokens the simulator hashes;
//   - a text prompt: its tokens as pkg/tokenize estimates them, which the
//     picker and modelsim compute from the text too;
//   - a prefix group: the group's first PrefixTokens (or all) tokens are
//     the same for every request of the group, the rest are the request's
//     own, different from every other request's.
//
// Only the last kind differs from the simulator's hashes in value (the
// simulator hashes its blocks without building tokens); which blocks are
// equal is the same.
func (t *Trace) AppendPrompt(dst []uint32, i int) []uint32 {
	r := &t.Requests[i]
	switch {
	case r.hashIDs != nil:
		return r.appendIDTokens(dst)
	case r.tokens != nil:
		return append(dst, r.tokens...)
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
	own := mix(uint64(i) ^ 0x6a09e667f3bcc909)
	for j := range r.PromptTokens {
		if j < shared {
			dst = append(dst, uint32(mix(g^uint64(j)*0x9e3779b97f4a7c15)>>32))
		} else {
			dst = append(dst, uint32(mix(own^uint64(j)*0xc2b2ae3d27d4eb4f)>>32))
		}
	}
	return dst
}
