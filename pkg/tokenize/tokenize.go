package tokenize

import "math/bits"

// Byte classes of the token estimate. Pieces never mix classes, except that
// a single space joins the piece after it.
const (
	clsNone uint8 = iota
	clsLetter
	clsDigit
	clsPunct
	clsSpace // ' ' only: it can join the next piece
	clsWS    // other whitespace
)

// maxRun is the longest run of one class in a piece, in bytes. With a joined
// space a piece is at most 6 bytes, so it always fits one uint64.
var maxRun = [...]uint8{clsNone: 0, clsLetter: 5, clsDigit: 3, clsPunct: 4, clsSpace: 4, clsWS: 4}

// byteClass maps each byte to its class. Bytes >= 0x80 count as letters so
// that UTF-8 text in any script forms words.
var byteClass = func() (t [256]uint8) {
	for i := range t {
		b := byte(i)
		switch {
		case b >= 'a' && b <= 'z', b >= 'A' && b <= 'Z', b >= 0x80:
			t[i] = clsLetter
		case b >= '0' && b <= '9':
			t[i] = clsDigit
		case b == ' ':
			t[i] = clsSpace
		case b == '\t', b == '\n', b == '\r', b == '\v', b == '\f':
			t[i] = clsWS
		default:
			t[i] = clsPunct
		}
	}
	return t
}()

// pieceSeed keeps the ids of this estimate apart from small integers that
// real token-id prompts use.
const pieceSeed = 0x9e3779b97f4a7c15

// fmix64 is the MurmurHash3 finaliser: a cheap bijective mix whose output
// bits all depend on every input bit.
func fmix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// pieceID is the token id of a piece of n (<= 8) bytes packed little-endian
// into acc. The length takes the top byte so "a" and "a\x00" differ.
func pieceID(acc uint64, n uint8) uint32 {
	return uint32(fmix64(acc ^ uint64(n)<<56 ^ pieceSeed))
}

// specialID is the id of a chat-template marker. Its length byte (>= 16) is
// one no text piece has, so a marker never shares its hash input with text.
func specialID(k uint8) uint32 { return pieceID(0, 16+k) }

// Chat template markers.
var (
	msgStart  = specialID(0) // before each message
	msgRole   = specialID(1) // between content and role
	msgEnd    = specialID(2) // after each message
	genPrompt = specialID(3) // the assistant turn the model continues
)

// tokState is the piece being built while bytes stream in.
type tokState struct {
	acc uint64 // piece bytes, little-endian
	n   uint8  // bytes in acc
	run uint8  // bytes of cls in the piece (not counting a joined space)
	cls uint8  // class of the piece, clsNone when empty
}

// feed adds one byte and appends the id of any piece it completes.
func (t *tokState) feed(dst []uint32, b byte) []uint32 {
	c := byteClass[b]
	if c == t.cls && t.run < maxRun[c] {
		t.acc |= uint64(b) << (8 * t.n)
		t.n++
		t.run++
		return dst
	}
	if t.cls == clsSpace && t.n == 1 && c != clsWS {
		// A lone space joins the word, number or punctuation after it.
		t.acc |= uint64(b) << 8
		t.n = 2
		t.run = 1
		t.cls = c
		return dst
	}
	if t.cls != clsNone {
		dst = append(dst, pieceID(t.acc, t.n))
	}
	t.acc, t.n, t.run, t.cls = uint64(b), 1, 1, c
	return dst
}

// flush ends the current piece, as at the end of a string.
func (t *tokState) flush(dst []uint32) []uint32 {
	if t.cls != clsNone {
		dst = append(dst, pieceID(t.acc, t.n))
	}
	*t = tokState{}
	return dst
}

// Tokenize appends the estimated token ids of text to dst and returns the
// extended slice. Equal texts give equal ids on every platform.
func Tokenize(dst []uint32, text string) []uint32 {
	var t tokState
	for i := 0; i < len(text); i++ {
		dst = t.feed(dst, text[i])
	}
	return t.flush(dst)
}

// CountTokens returns the estimated number of tokens in text without
// storing their ids.
func CountTokens(text string) int {
	var t tokState
	n := 0
	var one [1]uint32
	for i := 0; i < len(text); i++ {
		if len(t.feed(one[:0], text[i])) != 0 {
			n++
		}
	}
	if t.cls != clsNone {
		n++
	}
	return n
}

// Block hash constants (from xxHash64's primes: odd and well mixed).
const (
	blockSeed = 0x27d4eb2f165667c5
	blockK1   = 0x9e3779b185ebca87
	blockK2   = 0xc2b2ae3d27d4eb4f
)

// BlockHashes returns one chained hash per full block of blockSize tokens:
// hash i covers hash i-1 and the tokens of block i, so two prompts share
// hash i exactly when (barring collisions) their first (i+1)*blockSize tokens
// are equal. A partial last block gets no hash; blockSize <= 0 gives none.
func BlockHashes(tokens []uint32, blockSize int) []uint64 {
	if blockSize <= 0 {
		return nil
	}
	return AppendBlockHashes(make([]uint64, 0, len(tokens)/blockSize), tokens, blockSize)
}

// AppendBlockHashes appends the block hashes of tokens (see BlockHashes) to
// dst, so a caller can reuse one buffer across requests.
//
// Hash i is fmix64 of hash i-1 xor the content hash of block i, and a
// block's content hash does not depend on the chain: only one fmix64 per
// block is serial, so the content hashes of the next blocks run while it
// does. A content hash takes the block's tokens two at a time into four
// independent lanes (each a multiply-rotate-multiply round, as in
// xxHash64), which keeps the multiplier busy instead of waiting on one
// chain of rounds: hashing a 32k-token prompt costs the multiplies, not
// their latency.
func AppendBlockHashes(dst []uint64, tokens []uint32, blockSize int) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	h := fmix64(blockSeed ^ uint64(blockSize))
	for len(tokens) >= blockSize {
		h = fmix64(h ^ contentHash(tokens[:blockSize:blockSize]))
		tokens = tokens[blockSize:]
		dst = append(dst, h)
	}
	return dst
}

// round mixes the 64-bit value v into the lane acc.
func round(acc, v uint64) uint64 {
	return bits.RotateLeft64((acc^v)*blockK1, 31) * blockK2
}

// contentHash hashes one block's tokens, in order.
func contentHash(blk []uint32) uint64 {
	a, b, c, d := uint64(blockK1), uint64(blockK2), uint64(blockSeed), ^uint64(blockSeed)
	i := 0
	for ; i+8 <= len(blk); i += 8 {
		q := blk[i : i+8 : i+8]
		a = round(a, uint64(q[0])|uint64(q[1])<<32)
		b = round(b, uint64(q[2])|uint64(q[3])<<32)
		c = round(c, uint64(q[4])|uint64(q[5])<<32)
		d = round(d, uint64(q[6])|uint64(q[7])<<32)
	}
	x := bits.RotateLeft64(a, 1) + bits.RotateLeft64(b, 7) + bits.RotateLeft64(c, 12) + bits.RotateLeft64(d, 18)
	for ; i+2 <= len(blk); i += 2 {
		x = round(x, uint64(blk[i])|uint64(blk[i+1])<<32)
	}
	if i < len(blk) {
		x = round(x, uint64(blk[i]))
	}
	return x
}
