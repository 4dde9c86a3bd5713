package engine

import (
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// TestArgsRoundTrip: the flags Args writes, parsed over the defaults, give
// back every setting AddFlags covers.
func TestArgsRoundTrip(t *testing.T) {
	want := DefaultConfig()
	want.MaxNumSeqs = 7
	want.MaxNumBatchedTokens = 1234
	want.PrefillTokensPerSec = 2500.5
	want.TimePerOutputToken = 15 * time.Millisecond
	want.SchedulingPolicy = PolicyPriority
	want.BlockSize = 32
	want.NumGPUBlocks = 99
	want.EnablePrefixCaching = !DefaultConfig().EnablePrefixCaching
	got := DefaultConfig()
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	got.AddFlags(fs)
	if err := fs.Parse(want.Args()); err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("round trip of %v:\n got %+v\nwant %+v", want.Args(), got, want)
	}
}
