package simulate

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestTraceFormats(t *testing.T) {
	laneway := writeFile(t, "l.jsonl", `{"arrival_ms": 0, "prompt_tokens": 9}`+"\n")
	mooncakeTxt := writeFile(t, "m.txt", "\n"+`{"timestamp": 0, "input_length": 9, "output_length": 2, "hash_ids": [3]}`+"\n")
	azure := "testdata/azure_conv_excerpt.csv"
	for _, tt := range []struct {
		name, path, format string
		bs                 int
		wantPrompt         int
		wantCacheable      bool
		err                string
	}{
		{"laneway by content", laneway, FormatAuto, 0, 9, false, ""},
		{"mooncake by content", mooncakeTxt, "", 0, 9, true, ""},
		{"mooncake excerpt", mooncakeExcerpt, FormatAuto, 0, 7322, true, ""},
		{"azure by extension", azure, FormatAuto, 0, 374, false, ""},
		{"forced mooncake", mooncakeTxt, FormatMooncake, 512, 9, true, ""},
		{"forced laneway on a mooncake file", mooncakeTxt, FormatLaneway, 0, 0, false, `unknown field "timestamp"`},
		{"forced azure on JSON", laneway, FormatAzure, 0, 0, false, "header"},
		{"block size too small for the ids", mooncakeExcerpt, FormatMooncake, 256, 0, false, "want 29, one per 256 tokens"},
		{"unknown format", laneway, "parquet", 0, 0, false, `--trace-format "parquet"`},
		{"missing file", "testdata/none.jsonl", FormatAuto, 0, 0, false, "read trace"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tr, err := ReadTraceFileFormat(tt.path, tt.format, tt.bs)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := tr.Requests[0].PromptTokens; got != tt.wantPrompt || tr.cacheable != tt.wantCacheable {
				t.Fatalf("first prompt %d tokens, cacheable %t; want %d, %t", got, tr.cacheable, tt.wantPrompt, tt.wantCacheable)
			}
		})
	}
}

// TestMergeTraces: the Azure conversation and code excerpts as two
// classes, aligned on their timestamps, and a merge without a shared
// clock.
func TestMergeTraces(t *testing.T) {
	tr, err := ReadTraces("interactive=testdata/azure_conv_excerpt.csv,code=testdata/azure_code_excerpt.csv", FormatAuto, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Requests) != 10 {
		t.Fatalf("%d requests, want 6 + 4", len(tr.Requests))
	}
	var classes []string
	for _, q := range tr.Requests {
		classes = append(classes, q.Class)
	}
	want := []string{"interactive", "interactive", "interactive", "interactive", "interactive", "interactive", "code", "code", "code", "code"}
	if !slices.Equal(classes, want) {
		t.Fatalf("classes %v, want %v", classes, want)
	}
	// 18:17:03.9799600 (code's first) - 18:15:46.6805900 (conv's first).
	if got, want := tr.Requests[6].Arrival, int64(77_299_370_000); got != want {
		t.Fatalf("code's first request arrives at %d ns, want %d", got, want)
	}
	if tr.Span() != time.Duration(tr.Requests[9].Arrival) {
		t.Fatalf("span %v", tr.Span())
	}

	// A Mooncake trace has no clock: both parts start at 0, and a part's
	// own class headers stay.
	jl := writeFile(t, "own.jsonl", `{"arrival_ms": 5, "prompt_tokens": 3, "class": "mine"}`+"\n"+`{"arrival_ms": 6, "prompt_tokens": 3}`+"\n")
	tr, err = ReadTraces(mooncakeExcerpt+", batch="+jl, FormatAuto, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(tr.Requests); n != 10 || tr.Requests[8].Arrival != 5_000_000 || tr.Requests[8].Class != "mine" || tr.Requests[9].Class != "batch" || tr.Requests[0].Class != "" {
		t.Fatalf("merged: %d requests, %+v", n, tr.Requests[8:])
	}
	if tr.byArrival[0] != 0 || tr.byArrival[1] != 8 || tr.byArrival[2] != 9 {
		t.Fatalf("arrival order %v", tr.byArrival)
	}

	for _, tt := range []struct{ spec, err string }{
		{"a b=testdata/azure_code_excerpt.csv", "class \"a b\""},
		{"testdata/azure_code_excerpt.csv,", "an empty file name"},
		{"x=testdata/nothing.csv", "read trace"},
	} {
		if _, err := ReadTraces(tt.spec, FormatAuto, 0); err == nil || !strings.Contains(err.Error(), tt.err) {
			t.Errorf("ReadTraces(%q): %v, want %q", tt.spec, err, tt.err)
		}
	}
}

func TestShape(t *testing.T) {
	// Arrivals 0, 9, 12, 21, 48, 48, 69, 90 s.
	for _, tt := range []struct {
		name     string
		o        TraceOptions
		arrivals []int64 // ms, trace order
		source   string
		err      string
	}{
		{"as is", TraceOptions{}, []int64{0, 9000, 12000, 21000, 48000, 48000, 69000, 90000}, "", ""},
		{"twice as fast", TraceOptions{TimeScale: 0.5}, []int64{0, 4500, 6000, 10500, 24000, 24000, 34500, 45000}, " (time ×0.5)", ""},
		{"first 5", TraceOptions{Limit: 5}, []int64{0, 9000, 12000, 21000, 48000}, " (5 of 8 requests)", ""},
		{"first 48 s", TraceOptions{Duration: 48 * time.Second}, []int64{0, 9000, 12000, 21000}, " (the first 48s, 4 of 8 requests)", ""},
		{"first 48 s at half speed", TraceOptions{TimeScale: 2, Duration: 48 * time.Second}, []int64{0, 18000, 24000, 42000}, " (time ×2, the first 48s, 4 of 8 requests)", ""},
		{"both bounds", TraceOptions{Limit: 6, Duration: time.Hour}, []int64{0, 9000, 12000, 21000, 48000, 48000}, " (the first 1h0m0s, 6 of 8 requests)", ""},
		{"negative jitter", TraceOptions{Jitter: -1}, nil, "", "--jitter -1ns"},
		{"zero scale", TraceOptions{TimeScale: -1}, nil, "", "--time-scale -1"},
		{"negative limit", TraceOptions{Limit: -1}, nil, "", "--limit -1"},
		{"negative duration", TraceOptions{Duration: -1}, nil, "", "--duration -1ns"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tr, err := tt.o.Shape(readExcerpt(t), 1)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []int64
			for _, q := range tr.Requests {
				got = append(got, q.Arrival/int64(time.Millisecond))
			}
			if !slices.Equal(got, tt.arrivals) {
				t.Fatalf("arrivals %v ms, want %v", got, tt.arrivals)
			}
			if want := mooncakeExcerpt + tt.source; tr.Source != want {
				t.Fatalf("source %q, want %q", tr.Source, want)
			}
			if !tr.cacheable || len(tr.byArrival) != len(tr.Requests) {
				t.Fatalf("cacheable %t, %d indexed", tr.cacheable, len(tr.byArrival))
			}
		})
	}
}

// TestShapeKeepsAssignment: --limit after the rules keeps each request's
// class, so a truncated replay's requests are the full trace's.
func TestShapeKeepsAssignment(t *testing.T) {
	c := DefaultConfig()
	c.Trace, c.AssignClass = mooncakeExcerpt, "split:a=1,b=1"
	full, err := c.Load()
	if err != nil {
		t.Fatal(err)
	}
	c.Limit = 3
	part, err := c.Load()
	if err != nil {
		t.Fatal(err)
	}
	for i := range part.Trace.Requests {
		if a, b := part.Trace.Requests[i].Class, full.Trace.Requests[i].Class; a != b {
			t.Fatalf("request %d: class %q truncated, %q in full", i, a, b)
		}
	}
}

// TestJitter: every arrival moves later by less than the jitter, the same
// way for the same seed and another way for another, and the arrival
// order follows.
func TestJitter(t *testing.T) {
	shape := func(seed uint64) *Trace {
		tr, err := (&TraceOptions{Jitter: 3 * time.Second}).Shape(readExcerpt(t), seed)
		if err != nil {
			t.Fatal(err)
		}
		return tr
	}
	base := readExcerpt(t)
	a, b, c := shape(1), shape(1), shape(2)
	moved := false
	for i := range base.Requests {
		d := a.Requests[i].Arrival - base.Requests[i].Arrival
		if d < 0 || d >= int64(3*time.Second) {
			t.Fatalf("request %d moved by %v", i, time.Duration(d))
		}
		if a.Requests[i].Arrival != b.Requests[i].Arrival {
			t.Fatalf("request %d: the same seed gave %d and %d", i, a.Requests[i].Arrival, b.Requests[i].Arrival)
		}
		moved = moved || a.Requests[i].Arrival != c.Requests[i].Arrival
	}
	if !moved {
		t.Fatal("seeds 1 and 2 gave the same arrivals")
	}
	// Requests 4 and 5 share a timestamp (48 s): the jitter orders them.
	i4, i5 := slices.Index(a.byArrival, 4), slices.Index(a.byArrival, 5)
	if (a.Requests[4].Arrival < a.Requests[5].Arrival) != (i4 < i5) || !strings.HasSuffix(a.Source, " (jitter 3s)") {
		t.Fatalf("arrival order %v for arrivals %d, %d; source %q", a.byArrival, a.Requests[4].Arrival, a.Requests[5].Arrival, a.Source)
	}
}
