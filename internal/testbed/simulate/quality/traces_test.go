package quality

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/laneway-dev/laneway/internal/testbed/launch"
)

// runTraces is TestBenchQuality's real-trace scenarios: the Azure code
// and conversation traces as two classes, the Mooncake conversation trace
// with prefix caching (the prefix picker must hit more than least-loaded
// and round-robin), and the Mooncake trace's first minutes through real
// processes next to their simulation (reported, not judged: times depend
// on the machine). They are skipped without the public traces.
func runTraces(t *testing.T, w io.Writer, out string) {
	dir, err := TracesDir()
	t.Run("traces", func(t *testing.T) {
		if err != nil {
			t.Skip(err)
		}
		var azureServers int
		t.Run("azure", func(t *testing.T) {
			f, err := RunTrace(AzureScenario(dir), filepath.Join(out, "azure"))
			if err != nil {
				t.Fatal(err)
			}
			WriteTrace(w, f)
			azureServers = f.Servers
		})
		var mooncakeServers int
		t.Run("mooncake", func(t *testing.T) {
			f, err := RunTrace(MooncakeScenario(dir), filepath.Join(out, "mooncake"))
			if err != nil {
				t.Fatal(err)
			}
			WriteTrace(w, f)
			mooncakeServers = f.Servers
			p := f.Row("prefix")
			for _, other := range []string{"least-loaded", "round-robin"} {
				if o := f.Row(other); !(p.HitRate > o.HitRate) {
					t.Errorf("the prefix picker's hit rate %.2f%% is not above %s's %.2f%%", 100*p.HitRate, other, 100*o.HitRate)
				}
			}
		})
		for _, bw := range []struct {
			name    string
			sc      TraceScenario
			servers *int
		}{{"mooncake both ways", MooncakeScenario(dir), &mooncakeServers}, {"azure both ways", AzureScenario(dir), &azureServers}} {
			t.Run(bw.name, func(t *testing.T) {
				if *bw.servers == 0 {
					t.Skip("the scenario sized no fleet")
				}
				bins := binDir(t)
				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
				defer cancel()
				f, err := RunTraceTwoWay(ctx, bw.sc, *bw.servers, bins, filepath.Join(out, bw.sc.Name+"-both-ways"))
				if f == nil {
					t.Fatal(err)
				}
				WriteTraceTwoWay(w, f)
				if err != nil {
					fmt.Fprintf(w, "  the real run reported: %v\n", err)
				}
				if d := f.Agreement(); len(d) > 0 {
					io.WriteString(w, "  outside the bands (TTFT p50 ±20% per class, hit rate ±5 points): "+strings.Join(d, "; ")+"\n")
				} else {
					io.WriteString(w, "  inside the bands (TTFT p50 ±20% per class, hit rate ±5 points)\n")
				}
			})
		}
	})
}

// binDir is $LANEWAY_BIN, or the modelsim, epp and gateway built into a
// temporary folder.
func binDir(t *testing.T) string {
	if bins := os.Getenv("LANEWAY_BIN"); bins != "" {
		return bins
	}
	dir := t.TempDir()
	if _, err := launch.Build(dir, false, launch.CmdModelsim, launch.CmdEpp, launch.CmdGateway); err != nil {
		t.Fatal(err)
	}
	return dir
}
