package policy

import "testing"

func TestParseDPRank(t *testing.T) {
	cases := []struct {
		in     string
		lo, hi int
		ok     bool
	}{
		{"0", 0, 0, true},
		{"3", 3, 3, true},
		{" 1-2 ", 1, 2, true},
		{"2 - 5", 2, 5, true},
		{"4-4", 4, 4, true},
		{"", 0, 0, false},
		{"-1", 0, 0, false},
		{"3-1", 0, 0, false},
		{"1-", 0, 0, false},
		{"a", 0, 0, false},
		{"+1", 0, 0, false},
		{"1-2-3", 0, 0, false},
		{"70000", 0, 0, false},
	}
	for _, tc := range cases {
		lo, hi, ok := ParseDPRank(tc.in)
		if lo != tc.lo || hi != tc.hi || ok != tc.ok {
			t.Errorf("ParseDPRank(%q) = %d, %d, %t; want %d, %d, %t", tc.in, lo, hi, ok, tc.lo, tc.hi, tc.ok)
		}
	}
}
