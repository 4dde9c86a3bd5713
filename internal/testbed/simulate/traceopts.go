package simulate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// Trace formats of --trace-format.
const (
	// FormatAuto picks by the file: .csv is Azure, a JSON line with
	// hash_ids is Mooncake, any other JSON line Laneway.
	FormatAuto     = "auto"
	FormatLaneway  = "laneway"
	FormatMooncake = "mooncake"
	FormatAzure    = "azure"
)

// TraceOptions are how a trace is read and shaped before a run: the same
// for `laneway simulate` and for a real replay (cmd/loadgen --trace), so
// both replay the same requests at the same times.
type TraceOptions struct {
	// TraceFormat is FormatAuto (""), FormatLaneway, FormatMooncake or
	// FormatAzure.
	TraceFormat string
	// TraceBlockSize is the prompt tokens per Mooncake hash id (0:
	// DefaultTraceBlockSize).
	TraceBlockSize int
	// TimeScale multiplies every arrival time: 0.5 offers the trace at
	// twice its recorded rate, 2 at half (0: 1).
	TimeScale float64
	// Jitter delays every arrival by a seeded uniform draw in [0, Jitter),
	// after TimeScale: for traces whose timestamps are coarse (the
	// Mooncake traces come in 3-second buckets, a dozen requests at one
	// millisecond), so their requests do not all arrive at one instant.
	Jitter time.Duration
	// Limit keeps the first Limit requests by arrival (0: all); Duration
	// the requests arriving within Duration of the first (0: all). Both
	// apply after TimeScale and Jitter.
	Limit    int
	Duration time.Duration
}

// addTraceFlags binds the trace options to fs.
func (o *TraceOptions) addTraceFlags(fs *pflag.FlagSet) {
	if o.TraceFormat == "" {
		o.TraceFormat = FormatAuto
	}
	if o.TraceBlockSize == 0 {
		o.TraceBlockSize = DefaultTraceBlockSize
	}
	if o.TimeScale == 0 {
		o.TimeScale = 1
	}
	fs.StringVar(&o.TraceFormat, "trace-format", o.TraceFormat, "format of the --trace files: auto (.csv is Azure; a JSON line with hash_ids is Mooncake, else Laneway JSONL), laneway, mooncake or azure")
	fs.IntVar(&o.TraceBlockSize, "trace-block-size", o.TraceBlockSize, "prompt tokens per hash id of a Mooncake trace: prompts are built so that their blocks are equal exactly where the ids are")
	fs.Var((*positiveFloat)(&o.TimeScale), "time-scale", "multiply every arrival time by this: 0.5 replays the trace at twice its rate, 2 at half")
	fs.DurationVar(&o.Jitter, "jitter", o.Jitter, "delay every arrival by a random draw in [0, D) (seeded by --seed), after --time-scale: for traces with coarse timestamps (Mooncake's: 3s)")
	fs.IntVar(&o.Limit, "limit", o.Limit, "replay only the first N requests by arrival (0: all)")
	fs.DurationVar(&o.Duration, "duration", o.Duration, "replay only the requests arriving within this of the first, after --time-scale and --jitter (0: all)")
}

// positiveFloat is a flag value that must be a finite number above 0.
type positiveFloat float64

func (f *positiveFloat) String() string { return strconv.FormatFloat(float64(*f), 'g', -1, 64) }

func (f *positiveFloat) Type() string { return "float" }

func (f *positiveFloat) Set(s string) error {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || !(v > 0) || math.IsInf(v, 0) {
		return errors.New("want a positive number")
	}
	*f = positiveFloat(v)
	return nil
}

// ReadTraces reads --trace: one file, or several separated by commas,
// each optionally CLASS=FILE to give its requests without a class header
// that class. Several files merge into one trace: their requests in file
// order, arrivals aligned on the wall clock when every file has one (Azure
// timestamps), else each counted from its own start. format and blockSize
// are --trace-format and --trace-block-size.
func ReadTraces(spec, format string, blockSize int) (*Trace, error) {
	var parts []*Trace
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, fmt.Errorf("--trace %q: an empty file name", spec)
		}
		class, path := "", item
		if _, err := os.Stat(item); err != nil {
			if c, p, ok := strings.Cut(item, "="); ok {
				if !nameRE.MatchString(c) {
					return nil, fmt.Errorf("--trace %q: class %q: want a name of [A-Za-z0-9_.-]", spec, c)
				}
				class, path = c, p
			}
		}
		t, err := ReadTraceFileFormat(path, format, blockSize)
		if err != nil {
			return nil, err
		}
		if class != "" {
			for i := range t.Requests {
				if t.Requests[i].Class == "" {
					t.Requests[i].Class = class
				}
			}
		}
		parts = append(parts, t)
	}
	if len(parts) == 1 {
		return parts[0], nil
	}
	return mergeTraces(spec, parts)
}

// mergeTraces concatenates traces, aligning their arrivals on the wall
// clock when all of them have one.
func mergeTraces(source string, parts []*Trace) (*Trace, error) {
	aligned := true
	origin := int64(math.MaxInt64)
	n := 0
	for _, p := range parts {
		aligned = aligned && p.hasOrigin
		origin = min(origin, p.origin)
		n += len(p.Requests)
	}
	t := &Trace{Source: source, Requests: make([]Request, 0, n)}
	for _, p := range parts {
		shift := int64(0)
		if aligned {
			shift = p.origin - origin
		}
		for _, r := range p.Requests {
			r.Arrival += shift
			t.Requests = append(t.Requests, r)
		}
	}
	if aligned {
		t.origin, t.hasOrigin = origin, true
	}
	if err := t.finish(); err != nil {
		return nil, err
	}
	return t, nil
}

// ReadTraceFileFormat reads one trace file in a format (FormatAuto or ""
// detects it); blockSize is the Mooncake block size (0: the default).
func ReadTraceFileFormat(path, format string, blockSize int) (*Trace, error) {
	if blockSize == 0 {
		blockSize = DefaultTraceBlockSize
	}
	switch format {
	case "", FormatAuto, FormatLaneway, FormatMooncake, FormatAzure:
	default:
		return nil, fmt.Errorf("--trace-format %q: want auto, laneway, mooncake or azure", format)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read trace: %w", err)
	}
	if format == "" || format == FormatAuto {
		format = detectFormat(path, data)
	}
	r := bytes.NewReader(data)
	switch format {
	case FormatAzure:
		return ReadAzureCSV(r, path)
	case FormatMooncake:
		return ReadMooncake(r, path, blockSize)
	}
	return ReadJSONL(r, path)
}

// detectFormat guesses a trace file's format: .csv is Azure; otherwise
// the first non-blank line decides, Mooncake when it has hash_ids or
// input_length, else Laneway JSONL (whose reader reports what is wrong).
func detectFormat(path string, data []byte) string {
	if strings.EqualFold(filepath.Ext(path), ".csv") {
		return FormatAzure
	}
	for line := range bytes.Lines(data) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		var fields map[string]json.RawMessage
		if json.Unmarshal(line, &fields) == nil {
			_, ids := fields["hash_ids"]
			_, input := fields["input_length"]
			if ids || input {
				return FormatMooncake
			}
		}
		break
	}
	return FormatLaneway
}

// Shape applies TimeScale, Jitter (seeded by seed), Limit and Duration to
// t: it changes t's arrivals in place and returns it, or a new trace of
// the requests kept (in trace order).
func (o *TraceOptions) Shape(t *Trace, seed uint64) (*Trace, error) {
	scale := o.TimeScale
	if scale == 0 {
		scale = 1
	}
	switch {
	case !(scale > 0) || math.IsInf(scale, 0):
		return nil, fmt.Errorf("--time-scale %v: want a positive number", o.TimeScale)
	case o.Limit < 0:
		return nil, fmt.Errorf("--limit %d: want >= 0", o.Limit)
	case o.Duration < 0:
		return nil, fmt.Errorf("--duration %v: want >= 0", o.Duration)
	case o.Jitter < 0:
		return nil, fmt.Errorf("--jitter %v: want >= 0", o.Jitter)
	}
	var notes []string
	if scale != 1 {
		for i := range t.Requests {
			v := math.Round(float64(t.Requests[i].Arrival) * scale)
			if v >= math.MaxInt64 {
				return nil, fmt.Errorf("--time-scale %v: request %d would arrive after the year 2262", scale, i)
			}
			// Scaling by a positive factor keeps the arrival order, so
			// byArrival stays right.
			t.Requests[i].Arrival = int64(v)
		}
		notes = append(notes, "time ×"+strconv.FormatFloat(scale, 'g', -1, 64))
	}
	if o.Jitter > 0 {
		rng := rand.New(rand.NewPCG(seed, 0x717e4))
		for i := range t.Requests {
			a := &t.Requests[i].Arrival
			if *a > math.MaxInt64-int64(o.Jitter) {
				return nil, fmt.Errorf("--jitter %v: request %d would arrive after the year 2262", o.Jitter, i)
			}
			*a += rng.Int64N(int64(o.Jitter))
		}
		if err := t.finish(); err != nil { // the arrival order changed
			return nil, err
		}
		notes = append(notes, "jitter "+o.Jitter.String())
	}
	if o.Limit == 0 && o.Duration == 0 {
		return annotate(t, notes), nil
	}
	keep := make([]bool, len(t.Requests))
	t0 := t.Requests[t.byArrival[0]].Arrival
	kept := 0
	for _, i := range t.byArrival {
		if (o.Limit > 0 && kept == o.Limit) || (o.Duration > 0 && t.Requests[i].Arrival-t0 >= int64(o.Duration)) {
			break
		}
		keep[i] = true
		kept++
	}
	out := &Trace{Source: t.Source, Requests: make([]Request, 0, kept), origin: t.origin, hasOrigin: t.hasOrigin}
	for i, k := range keep {
		if k {
			out.Requests = append(out.Requests, t.Requests[i])
		}
	}
	if o.Duration > 0 {
		notes = append(notes, "the first "+o.Duration.String())
	}
	notes = append(notes, fmt.Sprintf("%d of %d requests", kept, len(t.Requests)))
	if err := out.finish(); err != nil {
		return nil, err
	}
	return annotate(out, notes), nil
}

// annotate adds how a trace was shaped to its Source.
func annotate(t *Trace, notes []string) *Trace {
	if len(notes) > 0 {
		t.Source += " (" + strings.Join(notes, ", ") + ")"
	}
	return t
}

// errNoTrace is Load's error without --trace or --generate.
var errNoTrace = errors.New("give --trace FILE or --generate SPEC")

// readTrace reads or generates c's trace and shapes it (Config.Load).
func (c *Config) readTrace() (*Trace, error) {
	switch {
	case c.Trace != "" && c.Generate != "":
		return nil, errors.New("give --trace or --generate, not both")
	case c.Trace != "":
		return ReadTraces(c.Trace, c.TraceFormat, c.TraceBlockSize)
	case c.Generate != "":
		return Generate(c.Generate, c.Seed)
	}
	return nil, errNoTrace
}
