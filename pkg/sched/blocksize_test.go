package sched

import (
	"testing"

	"github.com/laneway-dev/laneway/pkg/podmetrics"
)

// TestEngineBlockSizeIsCapped: the hashing block size follows the largest
// block size a live endpoint reports, but one endpoint cannot make it
// anything it likes: the audit's block_size="1073741824" from one endpoint
// took the pool's prefix hits from 1568 to 0 (no prompt is a whole block).
// A report above MaxEngineBlockSize counts as MaxEngineBlockSize.
func TestEngineBlockSizeIsCapped(t *testing.T) {
	const a, b = "10.0.0.1:8000", "10.0.0.2:8000"
	tests := []struct {
		name     string
		reported int
		want     int
	}{
		{"vLLM's default", 16, DefaultBlockSize},
		{"a larger real page", 128, 128},
		{"at the cap", MaxEngineBlockSize, MaxEngineBlockSize},
		{"the audit's", 1 << 30, MaxEngineBlockSize},
		{"just past the cap", MaxEngineBlockSize + 1, MaxEngineBlockSize},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newCore(t, byHeader(100, class("standard", 1, 0)), Options{Prefix: &PrefixOptions{}}, a, b)
			c.SetMetrics(0, a, podmetrics.Metrics{BlockSize: 16, Known: podmetrics.BlockSize}, false)
			c.SetMetrics(0, b, podmetrics.Metrics{BlockSize: tc.reported, Known: podmetrics.BlockSize}, false)
			if got := c.BlockSize(); got != tc.want {
				t.Errorf("BlockSize() = %d with %s reporting %d, want %d", got, b, tc.reported, tc.want)
			}
		})
	}
}
