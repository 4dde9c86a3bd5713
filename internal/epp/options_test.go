package epp

import (
	"math"
	"strings"
	"testing"
)

// TestDefaultHeldBodyBytes: half of GOMEMLIMIT when it is set, else 512
// MiB, never below one body of --max-body-bytes.
func TestDefaultHeldBodyBytes(t *testing.T) {
	cases := []struct {
		name     string
		memLimit int64
		maxBody  int
		want     int64
	}{
		{"GOMEMLIMIT unset", math.MaxInt64, 16 << 20, 512 << 20},
		{"half of GOMEMLIMIT", 1 << 30, 16 << 20, 512 << 20},
		{"a small GOMEMLIMIT", 160 << 20, 16 << 20, 80 << 20},
		{"never below a body", 16 << 20, 16 << 20, 16 << 20},
	}
	for _, tc := range cases {
		if got := defaultHeldBodyBytes(tc.memLimit, tc.maxBody); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestHeldBodyBytesFlag: Complete derives the budget when the flag is 0,
// keeps a value given, and Validate refuses one below --max-body-bytes.
func TestHeldBodyBytesFlag(t *testing.T) {
	cases := []struct {
		name    string
		held    int64
		wantErr string
	}{
		{name: "derived", held: 0},
		{name: "given", held: 1 << 30},
		{name: "below a body", held: 1000, wantErr: "--max-held-body-bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			o.MaxHeldBodyBytes = tc.held
			if err := o.Complete(); err != nil {
				t.Fatal(err)
			}
			if o.MaxHeldBodyBytes <= 0 || (tc.held != 0 && o.MaxHeldBodyBytes != tc.held) {
				t.Errorf("MaxHeldBodyBytes %d after Complete (flag %d)", o.MaxHeldBodyBytes, tc.held)
			}
			err := o.Validate()
			if (err != nil) != (tc.wantErr != "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("Validate: %v, want an error naming %q", err, tc.wantErr)
			}
		})
	}
}

// TestContainerMemoryLimit: with the container's memory limit in
// LANEWAY_MEMORY_LIMIT_BYTES (the chart's downward API) and no GOMEMLIMIT,
// the Go memory limit is 90% of it, leaving the rest to what the runtime
// does not count (the binary, stacks, freed pages not yet returned);
// GOMEMLIMIT set by hand wins, and a value that is not a byte count is an
// error naming the variable.
func TestContainerMemoryLimit(t *testing.T) {
	cases := []struct {
		name    string
		env     map[string]string
		want    int64 // 0: leave the runtime's limit alone
		wantErr bool
	}{
		{name: "none", env: map[string]string{}},
		{name: "1 GiB", env: map[string]string{MemoryLimitEnv: "1073741824"}, want: 966367638},
		{name: "GOMEMLIMIT wins", env: map[string]string{MemoryLimitEnv: "1073741824", "GOMEMLIMIT": "500MiB"}},
		{name: "not a number", env: map[string]string{MemoryLimitEnv: "1Gi"}, wantErr: true},
		{name: "zero", env: map[string]string{MemoryLimitEnv: "0"}, wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := containerMemoryLimit(func(k string) string { return tc.env[k] })
			if got != tc.want || (err != nil) != tc.wantErr || (err != nil && !strings.Contains(err.Error(), MemoryLimitEnv)) {
				t.Errorf("got %d, %v; want %d, error %t naming %s", got, err, tc.want, tc.wantErr, MemoryLimitEnv)
			}
		})
	}
}
