package tokenize

import (
	"encoding/binary"
	"math/bits"
)

// Word-at-a-time byte tests. Each looks at the 8 bytes of a little-endian
// word as lanes and sets the high bit of every lane that passes. v is the
// word with the lanes' high bits cleared, so a lane's sum below never
// carries into the next lane; the callers clear the lanes of bytes >= 0x80
// where those are not wanted.
const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
	lows  = 0x7f7f7f7f7f7f7f7f
)

// inRange marks the lanes of v (7-bit lanes) whose value is in [lo, hi]:
// adding 0x80-lo sets a lane's high bit iff the lane is >= lo, adding
// 0x7f-hi iff it is > hi.
func inRange(v uint64, lo, hi byte) uint64 {
	return (v + (0x80-uint64(lo))*ones) &^ (v + (0x7f-uint64(hi))*ones) & highs
}

// packHighs multiplies a word whose bytes have at most their high bit set
// so that the top byte of the product holds those 8 bits in lane order:
// lane j's bit lands at bit 56+j, and every other partial product lands at
// a distinct position outside the top byte, so nothing carries into it.
const packHighs = 0x0002040810204081

// lenMask[n] keeps the first n bytes of a little-endian word, and
// lenSeed[n] is what pieceID mixes into a piece of n bytes besides its
// bytes: fmix64(w&lenMask[n] ^ lenSeed[n]) is pieceID(w&lenMask[n], n).
var lenMask, lenSeed = func() (m, s [8]uint64) {
	for n := range m {
		m[n] = 1<<(8*n) - 1
		s[n] = uint64(n)<<56 ^ pieceSeed
	}
	return m, s
}()

// blockSpan is the bytes a block reads: 64 it classifies, and a word past
// the last piece that can start in it.
const blockSpan = 64 + 8

// minBlock is the shortest stretch of plain bytes worth a block: below it,
// classifying 64 bytes costs more than the few pieces it yields.
const minBlock = 16

// blockPieces tokenizes the string content b[i:stop] (stop is the next
// quote or backslash) up to 64 bytes at a time while at least minBlock
// bytes of it are left and out has room for a block's pieces; i must be a
// piece start with no pending piece. It returns the next piece start, the
// ids written, and false when the stretch holds a control character (the
// caller's byte loop reports it).
//
// A block is classified into bitmasks (bit p is byte i+p) a word at a
// time, every piece start in it is computed with bit operations, and the
// pieces are read off the start mask. Only pieces whose end is known are
// emitted: the last one in a block starts the next block, and the last
// one before stop is left to the caller (an escape may continue it). That
// is exact without carrying state between blocks: a piece start forgets
// everything before it (tokState.feed replaces its whole state there), so
// a block may treat its first byte as the start of a run, and a piece
// start depends only on the bytes up to it, so the bytes at and past stop
// (masked off) cannot move an earlier one.
func blockPieces(b []byte, i, stop int, out []uint32) (int, int, bool) {
	j := 0
	for i+minBlock <= stop && i+blockSpan <= len(b) && j+64 <= len(out) {
		blk := (*[blockSpan]byte)(b[i : i+blockSpan])
		valid := ^uint64(0)
		if stop-i < 64 {
			valid = 1<<(stop-i) - 1
		}
		l0, s0, c0 := classWord(binary.LittleEndian.Uint64(blk[0:]))
		l1, s1, c1 := classWord(binary.LittleEndian.Uint64(blk[8:]))
		l2, s2, c2 := classWord(binary.LittleEndian.Uint64(blk[16:]))
		l3, s3, c3 := classWord(binary.LittleEndian.Uint64(blk[24:]))
		l4, s4, c4 := classWord(binary.LittleEndian.Uint64(blk[32:]))
		l5, s5, c5 := classWord(binary.LittleEndian.Uint64(blk[40:]))
		l6, s6, c6 := classWord(binary.LittleEndian.Uint64(blk[48:]))
		l7, s7, c7 := classWord(binary.LittleEndian.Uint64(blk[56:]))
		if c0&c1&c2&c3&c4&c5&c6&c7&highs != highs && controls(blk)&valid != 0 {
			return i, j, false
		}
		lm := (l0 | l1<<8 | l2<<16 | l3<<24 | l4<<32 | l5<<40 | l6<<48 | l7<<56) & valid
		sm := (s0 | s1<<8 | s2<<16 | s3<<24 | s4<<32 | s5<<40 | s6<<48 | s7<<56) & valid
		// Digits and punctuation are told apart only where two of them
		// touch: a lone one is a piece of its own either way.
		o := ^(lm | sm) & valid
		var dm uint64
		if o&(o<<1) != 0 {
			for k := 0; k < 64; k += 8 {
				w := binary.LittleEndian.Uint64(blk[k:])
				dm |= (inRange(w&lows, '0', '9') &^ w) * packHighs >> 56 << k
			}
			dm &= valid
		}
		pm := o &^ dm
		// Runs start at bit 0 and wherever the class changes; a run
		// longer than its class's maxRun is cut every maxRun bytes.
		rs := lm&^(lm<<1) | sm&^(sm<<1) | dm&^(dm<<1) | pm&^(pm<<1)
		ps := rs | cuts5(lm, rs) | cuts4(sm, pm, rs)
		if dm != 0 {
			ps |= cuts3(dm, rs)
		}
		// A lone space (a space piece the next byte does not continue)
		// joins the piece after it: that piece's start goes.
		ps &^= (ps & sm &^ (sm >> 1)) << 1
		// The next block starts at the last piece start; taking it from
		// the mask before the walk lets the next block's loads start
		// while this one's ids are hashed.
		next := i + 63 - bits.LeadingZeros64(ps)
		j += emit(blk, ps, out[j:])
		i = next
		if valid != ^uint64(0) {
			break // the stretch ends in this block
		}
	}
	return i, j, true
}

// emit writes the ids of the pieces that start at the set bits of ps (bit
// 0 among them) and end at the next one; the piece at the highest bit has
// no known end and is left. It returns the ids written. A function of its
// own so that its loop has the registers to itself.
//
//go:noinline
func emit(blk *[blockSpan]byte, ps uint64, out []uint32) int {
	_ = blk[0] // one nil check, not one per piece
	masks, seeds := &lenMask, &lenSeed
	j := 0
	a := 0
	ps &= ps - 1
	for ps&(ps-1) != 0 {
		// Two pieces a turn: [a, e) and [e, f).
		e := bits.TrailingZeros64(ps) & 63
		ps &= ps - 1
		f := bits.TrailingZeros64(ps) & 63
		ps &= ps - 1
		n, m := (e-a)&7, (f-e)&7
		x := binary.LittleEndian.Uint64(blk[a&63:])&masks[n] ^ seeds[n]
		y := binary.LittleEndian.Uint64(blk[e:])&masks[m] ^ seeds[m]
		_ = out[j+1]
		out[j], out[j+1] = uint32(fmix64(x)), uint32(fmix64(y))
		j += 2
		a = f
	}
	if ps != 0 {
		e := bits.TrailingZeros64(ps) & 63
		n := (e - a) & 7
		out[j] = uint32(fmix64(binary.LittleEndian.Uint64(blk[a&63:])&masks[n] ^ seeds[n]))
		j++
	}
	return j
}

// controls returns the bitmask of a block's control characters (the rare
// path: classWord found one somewhere in the 64 bytes, maybe past stop).
func controls(blk *[blockSpan]byte) uint64 {
	var m uint64
	for k := 0; k < 64; k += 8 {
		w := binary.LittleEndian.Uint64(blk[k:])
		m |= (^(w&lows + 0x60*ones | w) & highs) * packHighs >> 56 << k
	}
	return m
}

// classWord classifies the 8 bytes of w: the bits of l and s (in lane
// order) mark the letters and the spaces; c has a lane's high bit clear
// where the byte is a control character. With f the lane or 0x20, a = f +
// 0x1f is >= 0x80 exactly for f >= 'a', and below 0x40 exactly for f ==
// 0x20: a space, or NUL, which c rejects.
func classWord(w uint64) (l, s, c uint64) {
	v := w & lows
	f := v | 0x20*ones
	a := f + (0x80-'a')*ones
	l = a&^(f+(0x7f-'z')*ones) | w
	s = ^(a | a<<1 | w)
	return (l & highs) * packHighs >> 56, (s & highs) * packHighs >> 56, v + 0x60*ones | w
}

// cutsN returns the cuts inside the runs of x (a class's bitmask) that
// start at the bits of rs: every N bytes from a run's start while the run
// goes on. A position N bytes into a run is one where x holds at it and
// at the N bytes before it.
func cuts5(x, rs uint64) uint64 {
	x2 := x & (x << 1)
	return cutsFrom(rs&x, x2&(x2<<2)&(x2<<4), 5)
}

// cuts4 does two classes of maxRun 4 at once: their runs never touch, so
// a start 4 bytes before a position deep into a run of one of them is a
// start of that run.
func cuts4(x, y, rs uint64) uint64 {
	x2, y2 := x&(x<<1), y&(y<<1)
	return cutsFrom(rs&(x|y), x2&(x2<<2)&(x<<4)|y2&(y2<<2)&(y<<4), 4)
}

func cuts3(x, rs uint64) uint64 {
	x2 := x & (x << 1)
	return cutsFrom(rs&x, x2&(x2<<2), 3)
}

// cutsFrom steps the run starts c forward n bytes at a time while the run
// goes on (deep marks the positions at least n bytes into their run).
func cutsFrom(c, deep uint64, n uint) uint64 {
	var cuts uint64
	for c = c << n & deep; c != 0; c = c << n & deep {
		cuts |= c
	}
	return cuts
}
