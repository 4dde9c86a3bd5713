package demo

import "testing"

func TestPredictionMiss(t *testing.T) {
	cases := []struct {
		measured, predicted int
		miss                bool
	}{
		{256, 255, false}, {261, 255, false}, {249, 255, false}, {262, 255, true}, {248, 255, true},
	}
	for _, tc := range cases {
		if got := predictionMiss(320, tc.measured, tc.predicted); (got != "") != tc.miss {
			t.Errorf("measured %d, predicted %d: %q, want a miss %t", tc.measured, tc.predicted, got, tc.miss)
		}
	}
}
