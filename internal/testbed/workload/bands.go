package workload

import (
	"fmt"
	"strings"
)

// Shares are the figures SPEC §11 judges a two-class run by. First is the
// favoured class (premium), Second the other (regular).
type Shares struct {
	First, Second string
	// FirstInPrefix and SecondInPrefix count each class among the first
	// Prefix completions (Prefix = PerClass, 320 in SPEC §11).
	Prefix                        int
	FirstInPrefix, SecondInPrefix int
	// SecondLeftAtFirstDrain is how many Second requests had not completed
	// when the last First request completed.
	SecondLeftAtFirstDrain int
	// SecondAtFirst80 is Second's completions when First reached 80.
	SecondAtFirst80 int
	// SecondGain80To240 is Second's completions between First's 80th and
	// 240th.
	SecondGain80To240 int
	// OK and Failed count answers with status 200 and the rest.
	OK, Failed int
}

// Analyze computes the shares of a two-class result.
func Analyze(r *Result) Shares {
	s := Shares{First: r.Spec.Classes[0], Second: r.Spec.Classes[len(r.Spec.Classes)-1], Prefix: r.Spec.PerClass}
	var first, second, at240 int
	at80 := -1
	for i, c := range r.Completions {
		if c.Err == nil && c.Status == 200 {
			s.OK++
		} else {
			s.Failed++
		}
		switch c.Class {
		case s.First:
			first++
			if i < s.Prefix {
				s.FirstInPrefix++
			}
			if first == 80 {
				at80 = second
			}
			if first == 240 {
				at240 = second
			}
			if first == r.Spec.PerClass {
				s.SecondLeftAtFirstDrain = r.Spec.PerClass - second
			}
		case s.Second:
			second++
			if i < s.Prefix {
				s.SecondInPrefix++
			}
		}
	}
	if at80 >= 0 {
		s.SecondAtFirst80 = at80
		s.SecondGain80To240 = at240 - at80
	}
	return s
}

// Check judges shares against the SPEC §11 bands for the quantum ratio:
// weighted (512:128) or equal (512:512). It returns every band missed.
func (s Shares) Check(weighted bool) []string {
	var miss []string
	bad := func(format string, a ...any) { miss = append(miss, fmt.Sprintf(format, a...)) }
	if s.Failed > 0 {
		bad("%d requests were not answered 200", s.Failed)
	}
	if weighted {
		if s.FirstInPrefix < 240 {
			bad("%s %d in the first %d, want >= 240", s.First, s.FirstInPrefix, s.Prefix)
		}
		if s.SecondInPrefix < 48 {
			bad("%s %d in the first %d, want >= 48", s.Second, s.SecondInPrefix, s.Prefix)
		}
		if s.SecondLeftAtFirstDrain < 220 || s.SecondLeftAtFirstDrain > 260 {
			bad("%s left at %s drain %d, want [220, 260]", s.Second, s.First, s.SecondLeftAtFirstDrain)
		}
		if s.SecondAtFirst80 < 12 {
			bad("%s %d when %s reached 80, want >= 12", s.Second, s.SecondAtFirst80, s.First)
		}
		if s.SecondGain80To240 < 32 {
			bad("%s gained %d between %s #80 and #240, want >= 32", s.Second, s.SecondGain80To240, s.First)
		}
	} else {
		if s.FirstInPrefix < 140 || s.FirstInPrefix > 180 {
			bad("%s %d in the first %d, want [140, 180]", s.First, s.FirstInPrefix, s.Prefix)
		}
		if s.SecondLeftAtFirstDrain > 20 {
			bad("%s left at %s drain %d, want <= 20", s.Second, s.First, s.SecondLeftAtFirstDrain)
		}
	}
	return miss
}

// String is a one-line summary.
func (s Shares) String() string {
	return strings.Join([]string{
		fmt.Sprintf("first %d: %s %d / %s %d", s.Prefix, s.First, s.FirstInPrefix, s.Second, s.SecondInPrefix),
		fmt.Sprintf("%s left at %s drain: %d", s.Second, s.First, s.SecondLeftAtFirstDrain),
		fmt.Sprintf("%s at %s #80: %d, gain #80→#240: %d", s.Second, s.First, s.SecondAtFirst80, s.SecondGain80To240),
		fmt.Sprintf("answered 200: %d, failed: %d", s.OK, s.Failed),
	}, "; ")
}
