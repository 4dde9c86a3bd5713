package tokenize

import (
	"bytes"
	"slices"
	"unicode/utf8"
)

// strClass is byteClass with the bytes that end a plain run of string
// content (quote, backslash, control characters) mapped to clsNone.
var strClass = func() (t [256]uint8) {
	t = byteClass
	t['"'], t['\\'] = clsNone, clsNone
	for c := range 0x20 {
		t[c] = clsNone
	}
	return t
}()

// tokString tokenizes the rest of a string (after the opening quote)
// straight into dst, as tokState.feed would over the string's decoded
// bytes (TestExtractPrompt and the fuzz targets compare the two through
// Tokenize). This is the hot loop of a long prompt. It goes a byte at a
// time with the piece being built in registers, and wherever a piece starts
// with a stretch of plain string bytes (no quote, backslash or control
// character) ahead, it hands the stretch to blockPieces, which reads it 64
// bytes at a time, several times faster. The next quote and backslash are
// found with bytes.IndexByte (vectorised) once per stretch between
// escapes, so a string costs O(len) however many escapes it has.
func (e *extractor) tokString() error {
	b := e.b
	dst := e.dst
	i := e.i
	// stop is the next backslash or quote at or after i (the stretch of
	// plain bytes ends there); quote is the next quote.
	quote, stop := e.stops(i, -1)
	var acc uint64
	var n, run, cls uint8
	for i < len(b) {
		c := b[i]
		k := strClass[c]
		if k == cls && run < maxRun[k] {
			acc |= uint64(c) << (8 * n)
			n++
			run++
			i++
			continue
		}
		if k != clsNone {
			if cls == clsSpace && n == 1 && k != clsWS {
				acc |= uint64(c) << 8
				n, run, cls = 2, 1, k
				i++
				continue
			}
			if cls != clsNone {
				dst = append(dst, pieceID(acc, n))
			}
			if i+minBlock <= stop && i+blockSpan <= len(b) {
				// A piece starts at i with a stretch of plain bytes ahead.
				if cap(dst)-len(dst) < 128 {
					dst = slices.Grow(dst, min(len(b)-i, 4096))
				}
				next, m, ok := blockPieces(b, i, stop, dst[len(dst):cap(dst)])
				dst = dst[:len(dst)+m]
				if !ok {
					stop = next // a control character: this loop reports it
				}
				if next > i {
					i = next
					acc, n, run, cls = 0, 0, 0, clsNone
					continue
				}
			}
			acc, n, run, cls = uint64(c), 1, 1, k
			i++
			continue
		}
		switch {
		case c == '"':
			if cls != clsNone {
				dst = append(dst, pieceID(acc, n))
			}
			e.i = i + 1
			e.dst = dst
			return nil
		case c == '\\':
			e.i = i
			r, w, err := e.escape()
			if err != nil {
				return err
			}
			i += w
			quote, stop = e.stops(i, quote)
			t := tokState{acc: acc, n: n, run: run, cls: cls}
			if r < utf8.RuneSelf {
				dst = t.feed(dst, byte(r))
			} else {
				var enc [utf8.UTFMax]byte
				for _, x := range enc[:utf8.EncodeRune(enc[:], r)] {
					dst = t.feed(dst, x)
				}
			}
			acc, n, run, cls = t.acc, t.n, t.run, t.cls
		default:
			e.i = i
			return e.syntax("control character in string")
		}
	}
	e.i = len(b)
	return e.syntax("unterminated string")
}

// stops returns the next quote at or after i (quote, when it is not behind
// i, is the one already known) and the next backslash or quote, whichever
// comes first; len(b) stands for none.
func (e *extractor) stops(i, quote int) (int, int) {
	b := e.b
	if quote < i {
		quote = len(b)
		if q := bytes.IndexByte(b[i:], '"'); q >= 0 {
			quote = i + q
		}
	}
	if s := bytes.IndexByte(b[i:quote], '\\'); s >= 0 {
		return quote, i + s
	}
	return quote, quote
}
