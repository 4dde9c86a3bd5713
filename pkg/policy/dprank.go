package policy

import (
	"strconv"
	"strings"
)

// DPRankHeader bounds a request to a range of data-parallel ranks (SPEC
// §5): "N" or "N-M", ranks counted from 0 in the order of the pool's
// target ports. The reference router has no request-side rank hint, so
// this header is Laneway's own.
const DPRankHeader = "x-laneway-dp-rank"

// MaxDPRank is the highest rank a header may name: an InferencePool has at
// most 8 target ports, and the bound keeps a malformed value from
// meaning "any".
const MaxDPRank = 1 << 16

// ParseDPRank reads a rank bound, "N" or "N-M" with 0 <= N <= M <=
// MaxDPRank (spaces around the numbers allowed). A malformed value is
// ignored (ok false), as every other malformed hint is.
func ParseDPRank(s string) (lo, hi int, ok bool) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, 0, false
	}
	a, b, isRange := strings.Cut(s, "-")
	parse := func(v string) (int, bool) {
		v = strings.TrimSpace(v)
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > MaxDPRank || strings.HasPrefix(v, "+") {
			return 0, false
		}
		return n, true
	}
	lo, ok = parse(a)
	if !ok {
		return 0, 0, false
	}
	hi = lo
	if isRange {
		if hi, ok = parse(b); !ok || hi < lo {
			return 0, 0, false
		}
	}
	return lo, hi, true
}
