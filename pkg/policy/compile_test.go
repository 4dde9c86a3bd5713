package policy

import (
	"math"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/pkg/drr"
)

const samplesDir = "../../config/samples"

func mustCompileFile(t testing.TB, name string) (*Config, *Compiled) {
	t.Helper()
	cfg, err := LoadFile(filepath.Join(samplesDir, name))
	if err != nil {
		t.Fatalf("load sample %s: %v", name, err)
	}
	comp, err := cfg.Compile()
	if err != nil {
		t.Fatalf("compile sample %s: %v", name, err)
	}
	return cfg, comp
}

func mustCompileYAML(t testing.TB, src string) *Compiled {
	t.Helper()
	cfg, err := LoadYAML([]byte(src))
	if err != nil {
		t.Fatalf("LoadYAML: %v", err)
	}
	comp, err := cfg.Compile()
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	return comp
}

// resolveCase is one request and the class (model profile, name) it must
// land in.
type resolveCase struct {
	model, header string
	uncached      uint64
	wantModel     string
	want          string
}

func checkResolve(t *testing.T, comp *Compiled, cases []resolveCase) {
	t.Helper()
	for _, c := range cases {
		i := comp.Resolve(c.model, c.header, c.uncached)
		if i < 0 || i >= len(comp.Classes) {
			t.Errorf("Resolve(%q, %q, %d) = %d, out of range", c.model, c.header, c.uncached, i)
			continue
		}
		if got := comp.Info[i]; got.Model != c.wantModel || got.Name != c.want {
			t.Errorf("Resolve(%q, %q, %d) = %q/%q, want %q/%q", c.model, c.header, c.uncached, got.Model, got.Name, c.wantModel, c.want)
		}
	}
}

// TestResolveSamples checks the seed samples resolve as the seeds document.
func TestResolveSamples(t *testing.T) {
	t.Run("cache buckets", func(t *testing.T) {
		_, comp := mustCompileFile(t, "policy-cache-buckets.yaml")
		checkResolve(t, comp, []resolveCase{
			{header: "", uncached: 0, want: "cached"},
			{header: "", uncached: 3071, want: "cached"},
			{header: "", uncached: 3072, want: "uncached"},
			{header: "", uncached: math.MaxUint64, want: "uncached"},
			{header: "standard", uncached: 3071, want: "cached"},
			{header: "  standard\t", uncached: 3072, want: "uncached"},
			{header: "no-such-family", uncached: 3072, want: "uncached"},
			// A physical family×bucket class cannot be named directly: the
			// name is an unknown family, so the default family and the
			// request's own bucket decide.
			{header: "cached", uncached: 5000, want: "uncached"},
			{header: "uncached", uncached: 10, want: "cached"},
		})
	})
	t.Run("premium regular", func(t *testing.T) {
		_, comp := mustCompileFile(t, "policy-premium-regular.yaml")
		checkResolve(t, comp, []resolveCase{
			{header: "premium", uncached: 512, want: "premium"},
			{header: "regular", uncached: 512, want: "regular"},
			{header: "", uncached: 512, want: "regular"},
			{header: "gold", uncached: 512, want: "regular"},
			{header: "Premium", uncached: 512, want: "regular"}, // names are case-sensitive
		})
	})
	t.Run("single explicit class", func(t *testing.T) {
		_, comp := mustCompileFile(t, "policy-single-class.yaml")
		checkResolve(t, comp, []resolveCase{
			{header: "", uncached: 1, want: "standard"},
			{header: "standard", uncached: 1, want: "standard"},
			{header: "anything", uncached: 99999, want: "standard"},
		})
	})
	t.Run("families, explicit class and a model profile", func(t *testing.T) {
		_, comp := mustCompileFile(t, "policy-models.yaml")
		const llama = "meta-llama/Llama-3.1-8B-Instruct"
		checkResolve(t, comp, []resolveCase{
			{model: "other", header: "", uncached: 100, want: "interactive-short"},
			{model: "other", header: "", uncached: 2048, want: "interactive-long"},
			{model: "other", header: "background", uncached: 2047, want: "background-short"},
			{model: "other", header: "background", uncached: 2048, want: "background-long"},
			{model: "other", header: "batch", uncached: 1 << 20, want: "batch"},
			{model: "", header: "batch", uncached: 0, want: "batch"},
			// Physical class names are not selectable.
			{model: "other", header: "background-long", uncached: 10, want: "interactive-short"},
			// The model profile replaces the root one entirely.
			{model: llama, header: "", uncached: 10, wantModel: llama, want: "gold"},
			{model: llama, header: "silver", uncached: 10, wantModel: llama, want: "silver"},
			{model: llama, header: "batch", uncached: 10, wantModel: llama, want: "gold"},
			{model: llama, header: "background", uncached: 5000, wantModel: llama, want: "gold"},
		})
	})
}

// TestResolveDefaultClass covers profiles without families.
func TestResolveDefaultClass(t *testing.T) {
	tests := []struct {
		name, yaml, header, want string
	}{
		{"first listed class without default_policy_class", `policy_classes: [{name: b, quantum: 1}, {name: a, quantum: 1}]`, "zzz", "b"},
		{"default_policy_class", "default_policy_class: a\npolicy_classes: [{name: b, quantum: 1}, {name: a, quantum: 1}]", "", "a"},
		{"explicit name wins over the default", "default_policy_class: a\npolicy_classes: [{name: b, quantum: 1}, {name: a, quantum: 1}]", "b", "b"},
		{"no policy: synthetic class", ``, "anything", SyntheticClassName},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			comp := mustCompileYAML(t, tt.yaml)
			checkResolve(t, comp, []resolveCase{{header: tt.header, uncached: 5, want: tt.want}})
		})
	}
}

func TestResolveManyBuckets(t *testing.T) {
	comp := mustCompileYAML(t, `
default_policy_family: f
uncached_isl_buckets:
  - {min_tokens: 0, bucket: b0}
  - {min_tokens: 10, bucket: b1}
  - {min_tokens: 20, bucket: b2}
  - {min_tokens: 30, bucket: b3}
  - {min_tokens: 40, bucket: b4}
policy_classes:
  - {name: c0, policy_family: f, cache_bucket: b0, quantum: 1}
  - {name: c1, policy_family: f, cache_bucket: b1, quantum: 1}
  - {name: c2, policy_family: f, cache_bucket: b2, quantum: 1}
  - {name: c3, policy_family: f, cache_bucket: b3, quantum: 1}
  - {name: c4, policy_family: f, cache_bucket: b4, quantum: 1}
`)
	for u := uint64(0); u < 60; u++ {
		want := []string{"c0", "c1", "c2", "c3", "c4"}[min(u/10, 4)]
		checkResolve(t, comp, []resolveCase{{uncached: u, want: want}})
	}
}

// TestSyntheticClass checks the no-policy class of SPEC §2.
func TestSyntheticClass(t *testing.T) {
	comp := mustCompileYAML(t, ``)
	want := []drr.ClassConfig{{
		Name: "default", Quantum: 1, Policy: drr.FCFS, Queueing: false,
		RequestLimitPerWorker: drr.NoLimit, RawISLLimitPerWorker: drr.NoLimit, CachedLimitPerWorker: drr.NoLimit,
	}}
	if !reflect.DeepEqual(comp.Classes, want) {
		t.Errorf("Classes = %+v, want %+v", comp.Classes, want)
	}
	if comp.Busy[0].Queueing() || !comp.Info[0].Synthetic {
		t.Errorf("synthetic class: busy %+v info %+v", comp.Busy[0], comp.Info[0])
	}
}

// TestCompileHandOff checks the drr slice and the busy tests, index by index.
func TestCompileHandOff(t *testing.T) {
	cfg, comp := mustCompileFile(t, "policy-models.yaml")
	const llama = "meta-llama/Llama-3.1-8B-Instruct"
	wantClasses := []drr.ClassConfig{
		{Name: "interactive-short", Quantum: 4096, Policy: drr.WSPT, Queueing: true, RequestLimitPerWorker: drr.NoLimit, RawISLLimitPerWorker: drr.NoLimit, CachedLimitPerWorker: drr.NoLimit, WaitBudget: 30 * time.Second},
		{Name: "interactive-long", Quantum: 2048, Policy: drr.FCFS, Queueing: true, RequestLimitPerWorker: drr.NoLimit, RawISLLimitPerWorker: drr.NoLimit, CachedLimitPerWorker: drr.NoLimit},
		{Name: "background-short", Quantum: 1024, Policy: drr.EDF, Queueing: true, RequestLimitPerWorker: drr.NoLimit, RawISLLimitPerWorker: drr.NoLimit, CachedLimitPerWorker: drr.NoLimit, WaitBudget: 2 * time.Minute},
		{Name: "background-long", Quantum: 512, Policy: drr.EDF, Queueing: true, RequestLimitPerWorker: drr.NoLimit, RawISLLimitPerWorker: 65536, CachedLimitPerWorker: 131072},
		{Name: "batch", Quantum: 256, Policy: drr.FCFS, Queueing: true, RequestLimitPerWorker: 0, RawISLLimitPerWorker: drr.NoLimit, CachedLimitPerWorker: drr.NoLimit},
		{Name: llama + "/silver", Quantum: 1, Policy: drr.FCFS, Queueing: true, RequestLimitPerWorker: drr.NoLimit, RawISLLimitPerWorker: drr.NoLimit, CachedLimitPerWorker: drr.NoLimit},
		{Name: llama + "/gold", Quantum: 4, Policy: drr.FCFS, Queueing: true, RequestLimitPerWorker: drr.NoLimit, RawISLLimitPerWorker: drr.NoLimit, CachedLimitPerWorker: drr.NoLimit},
	}
	if !reflect.DeepEqual(comp.Classes, wantClasses) {
		t.Errorf("Classes:\n got %+v\nwant %+v", comp.Classes, wantClasses)
	}
	wantBusy := []BusyTest{
		{Threshold: 2048, HasThreshold: true, Ratio: 0.5},
		{Frac: 0.75, HasFrac: true},
		{Frac: 0.5, HasFrac: true},
		{Frac: 0.5, HasFrac: true},
		{Threshold: 1024, HasThreshold: true},
		{Frac: 1.5, HasFrac: true},
		{Frac: 1.5, HasFrac: true},
	}
	if !reflect.DeepEqual(comp.Busy, wantBusy) {
		t.Errorf("Busy:\n got %+v\nwant %+v", comp.Busy, wantBusy)
	}
	if len(comp.Info) != len(comp.Classes) || comp.Info[5].Model != llama || comp.Info[5].Name != "silver" {
		t.Errorf("Info = %+v", comp.Info)
	}
	if got := comp.Index(llama, "gold"); got != 6 {
		t.Errorf("Index(llama, gold) = %d, want 6", got)
	}
	if got := comp.Index("", "nope"); got != -1 {
		t.Errorf("Index of a missing class = %d, want -1", got)
	}
	// Compile refuses an invalid config.
	cfg.Root.Classes[0].Quantum = 0
	if _, err := cfg.Compile(); err == nil {
		t.Error("Compile accepted quantum 0")
	}
}

func TestBusyTest(t *testing.T) {
	tests := []struct {
		name         string
		b            BusyTest
		active, maxB uint64
		want         bool
	}{
		{"no threshold never busy", BusyTest{}, 1 << 40, 8192, false},
		{"threshold is strict", BusyTest{Threshold: 1536, HasThreshold: true}, 1536, 8192, false},
		{"above threshold", BusyTest{Threshold: 1536, HasThreshold: true}, 1537, 8192, true},
		{"frac is strict", BusyTest{Frac: 1, HasFrac: true}, 8192, 8192, false},
		{"above frac", BusyTest{Frac: 1, HasFrac: true}, 8193, 8192, true},
		{"frac above 1", BusyTest{Frac: 1.5, HasFrac: true}, 12289, 8192, true},
		{"frac unknown max uses 10M", BusyTest{Frac: 1, HasFrac: true}, 9_999_999, 0, false},
		{"frac unknown max busy past 10M", BusyTest{Frac: 1, HasFrac: true}, 10_000_001, 0, true},
		{"either test suffices", BusyTest{Threshold: 100, HasThreshold: true, Frac: 10, HasFrac: true}, 101, 8192, true},
		{"zero threshold: any prefill is busy", BusyTest{HasThreshold: true}, 1, 8192, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.b.EndpointBusy(tt.active, tt.maxB); got != tt.want {
				t.Errorf("EndpointBusy(%d, %d) = %v, want %v", tt.active, tt.maxB, got, tt.want)
			}
		})
	}
}

func TestSharedBlocked(t *testing.T) {
	tests := []struct {
		name           string
		ratio          float64
		busy, eligible int
		want           bool
	}{
		{"all busy", 0, 3, 3, true},
		{"one idle", 0, 2, 3, false},
		{"no eligible endpoint is not blocked", 0, 0, 0, false},
		{"ratio 0.5 of 4: 2 busy", 0.5, 2, 4, true},
		{"ratio 0.5 of 4: 1 busy", 0.5, 1, 4, false},
		{"ratio 0.3 of 10: 3 busy despite rounding", 0.3, 3, 10, true},
		{"ratio 0.3 of 10: 2 busy", 0.3, 2, 10, false},
		{"ratio 1 is all", 1, 4, 4, true},
		{"ratio 1, one idle", 1, 3, 4, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := BusyTest{HasThreshold: true, Ratio: tt.ratio}
			if got := b.SharedBlocked(tt.busy, tt.eligible); got != tt.want {
				t.Errorf("SharedBlocked(%d, %d) with ratio %v = %v, want %v", tt.busy, tt.eligible, tt.ratio, got, tt.want)
			}
		})
	}
}

func TestBusyTestString(t *testing.T) {
	tests := []struct {
		b    BusyTest
		want string
	}{
		{BusyTest{}, "no busy threshold (never queues)"},
		{BusyTest{Threshold: 1536, HasThreshold: true}, "threshold 1536 tokens"},
		{BusyTest{Frac: 0.75, HasFrac: true, Ratio: 0.5}, "threshold 0.75 × max_num_batched_tokens, busy_worker_ratio 0.5"},
	}
	for _, tt := range tests {
		if got := tt.b.String(); got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
	}
}

func TestDRRName(t *testing.T) {
	if got := DRRName("", "gold"); got != "gold" {
		t.Errorf("DRRName root = %q", got)
	}
	if got := DRRName("org/model", "gold"); got != "org/model/gold" {
		t.Errorf("DRRName model = %q", got)
	}
}

// TestResolveDoesNotAllocate guards the hot-path property the benchmark
// reports; an allocation count is deterministic, unlike a timing.
func TestResolveDoesNotAllocate(t *testing.T) {
	_, comp := mustCompileFile(t, "policy-models.yaml")
	allocs := testing.AllocsPerRun(1000, func() {
		comp.Resolve("other", " background ", 4000)
		comp.Resolve("meta-llama/Llama-3.1-8B-Instruct", "silver", 1)
		comp.Resolve("", "", 0)
	})
	if allocs != 0 {
		t.Errorf("Resolve allocates %.1f times per call set, want 0", allocs)
	}
}

func BenchmarkResolve(b *testing.B) {
	_, comp := mustCompileFile(b, "policy-models.yaml")
	headers := []string{"", "interactive", "background", "batch", "unknown-family"}
	b.ReportAllocs()
	sink := 0
	for i := 0; b.Loop(); i++ {
		sink += comp.Resolve("other", headers[i%len(headers)], uint64(i%4096))
	}
	if sink < 0 {
		b.Fatal("impossible")
	}
}

func TestBusyTestLimit(t *testing.T) {
	tests := []struct {
		name       string
		rule       BusyTest
		maxBatched uint64
		want       uint64
	}{
		{"none", BusyTest{}, 8192, 0},
		{"threshold", BusyTest{Threshold: 1536, HasThreshold: true}, 8192, 1536},
		{"fraction", BusyTest{Frac: 0.5, HasFrac: true}, 8192, 4096},
		{"fraction of unknown", BusyTest{Frac: 1, HasFrac: true}, 0, UnknownMaxBatchedTokens},
		{"the smaller of both", BusyTest{Threshold: 9000, HasThreshold: true, Frac: 1, HasFrac: true}, 8192, 8192},
		{"huge fraction saturates", BusyTest{Frac: 1e300, HasFrac: true}, 8192, 1 << 63},
	}
	for _, tt := range tests {
		if got := tt.rule.Limit(tt.maxBatched); got != tt.want {
			t.Errorf("%s: Limit(%d) = %d, want %d", tt.name, tt.maxBatched, got, tt.want)
		}
	}
	// Limit is the busy test's edge: at the limit not busy, past it busy.
	r := BusyTest{Threshold: 1536, HasThreshold: true}
	if r.EndpointBusy(r.Limit(8192), 8192) || !r.EndpointBusy(r.Limit(8192)+1, 8192) {
		t.Errorf("Limit is not the edge of EndpointBusy")
	}
}
