package tokenize

import (
	"slices"
	"strings"
	"testing"
)

// piecesOf returns the ids Tokenize should produce for an explicit split.
func piecesOf(pieces ...string) []uint32 {
	var ids []uint32
	for _, p := range pieces {
		var acc uint64
		for i := len(p) - 1; i >= 0; i-- {
			acc = acc<<8 | uint64(p[i])
		}
		ids = append(ids, pieceID(acc, uint8(len(p))))
	}
	return ids
}

func TestTokenizeSplits(t *testing.T) {
	tests := []struct {
		name string
		text string
		want []string
	}{
		{"empty", "", nil},
		{"word", "hello", []string{"hello"}},
		{"long word cut at 5", "internationalization", []string{"inter", "natio", "naliz", "ation"}},
		{"space joins next word", "the cat", []string{"the", " cat"}},
		{"two spaces stay apart", "a  b", []string{"a", "  ", "b"}},
		{"digits in threes", "1234567", []string{"123", "456", "7"}},
		{"space joins number", "x 42", []string{"x", " 42"}},
		{"punctuation run", "wait...!?", []string{"wait", "...!", "?"}},
		{"space joins punctuation", "a (b)", []string{"a", " (", "b", ")"}},
		{"newlines", "a\n\nb", []string{"a", "\n\n", "b"}},
		{"space before newline", "a \nb", []string{"a", " ", "\n", "b"}},
		{"utf8 counts as letters", "héllo", []string{"héllo"[:5], "o"}},
		{"mixed letters digits", "abc123", []string{"abc", "123"}},
		{"trailing space", "hi ", []string{"hi", " "}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Tokenize(nil, tt.text)
			if want := piecesOf(tt.want...); !slices.Equal(got, want) {
				t.Fatalf("Tokenize(%q) = %v, want pieces %q = %v", tt.text, got, tt.want, want)
			}
			if n := CountTokens(tt.text); n != len(tt.want) {
				t.Fatalf("CountTokens(%q) = %d, want %d", tt.text, n, len(tt.want))
			}
		})
	}
}

// englishSample is ordinary prose, used to check the documented ratio.
const englishSample = `The scheduler holds each request in the lane of its policy class until an
eligible model server has spare prefill capacity. When several classes are
waiting, deficit round robin decides which one goes next: every class earns
credit in proportion to its quantum, and a request leaves when its class can
pay for the uncached prompt tokens it will cost. Premium traffic therefore
receives a larger share of service under pressure, while regular traffic
keeps making progress, and once premium demand subsides the regular class can
use all of the available capacity again.`

func TestTokenizeEnglishRatio(t *testing.T) {
	n := CountTokens(englishSample)
	ratio := float64(len(englishSample)) / float64(n)
	if ratio < 3.5 || ratio > 5 {
		t.Fatalf("English sample: %d bytes, %d tokens, %.2f bytes/token; want about 4", len(englishSample), n, ratio)
	}
}

func TestTokenizeDeterministicAndAppends(t *testing.T) {
	a := Tokenize(nil, englishSample)
	prefix := []uint32{7, 8}
	b := Tokenize(slices.Clone(prefix), englishSample)
	if !slices.Equal(b[:2], prefix) || !slices.Equal(b[2:], a) {
		t.Fatalf("Tokenize did not append to dst unchanged")
	}
	if c := Tokenize(nil, strings.Clone(englishSample)); !slices.Equal(a, c) {
		t.Fatalf("Tokenize not deterministic")
	}
	// A pinned id guards against an accidental change of the hash, which
	// would make the picker and an older simulator disagree.
	if got := Tokenize(nil, "hello")[0]; got != pinnedHello {
		t.Fatalf("id of %q = %#x, want %#x", "hello", got, pinnedHello)
	}
}

const pinnedHello = 0xdb2f35d5

func TestBlockHashes(t *testing.T) {
	seq := func(n int, base uint32) []uint32 {
		s := make([]uint32, n)
		for i := range s {
			s[i] = base + uint32(i)
		}
		return s
	}
	a := seq(64, 1000)
	tests := []struct {
		name      string
		tokens    []uint32
		blockSize int
		wantLen   int
	}{
		{"four full blocks", a, 16, 4},
		{"partial block has no hash", a[:63], 16, 3},
		{"shorter than a block", a[:15], 16, 0},
		{"odd block size", a, 5, 12},
		{"block size one", a[:3], 1, 3},
		{"zero block size", a, 0, 0},
		{"negative block size", a, -4, 0},
		{"empty", nil, 16, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := BlockHashes(tt.tokens, tt.blockSize)
			if len(got) != tt.wantLen {
				t.Fatalf("len = %d, want %d", len(got), tt.wantLen)
			}
			if app := AppendBlockHashes([]uint64{1}, tt.tokens, tt.blockSize); !slices.Equal(app[1:], got) || app[0] != 1 {
				t.Fatalf("AppendBlockHashes disagrees with BlockHashes")
			}
		})
	}

	// Chaining: a change in block 1 changes hashes 1.. but not 0; equal
	// blocks at different positions hash differently.
	b := slices.Clone(a)
	b[20]++
	ha, hb := BlockHashes(a, 16), BlockHashes(b, 16)
	if ha[0] != hb[0] {
		t.Fatalf("block 0 hash changed by a change in block 1")
	}
	for i := 1; i < 4; i++ {
		if ha[i] == hb[i] {
			t.Fatalf("block %d hash unchanged after a change in block 1", i)
		}
	}
	same := slices.Repeat([]uint32{5}, 32)
	if h := BlockHashes(same, 16); h[0] == h[1] {
		t.Fatalf("equal blocks at positions 0 and 1 share a hash; the chain is missing")
	}
	// Order inside a block matters.
	c := slices.Clone(a)
	c[0], c[1] = c[1], c[0]
	if BlockHashes(c, 16)[0] == ha[0] {
		t.Fatalf("swapping two tokens kept the block hash")
	}
}
