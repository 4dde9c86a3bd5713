package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"time"

	"github.com/laneway-dev/laneway/internal/status"
)

// runStatus is `laneway status --epp HOST:PORT [--watch] [--output json]`:
// the picker's status page (its --status-port, 9091 on the loopback
// address by default) as tables or JSON.
func runStatus(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("status", stderr)
	epp := fs.String("epp", "", "The picker's status page address, HOST:PORT (its --status-bind and --status-port: 127.0.0.1:9091 by default, through kubectl port-forward in a cluster).")
	watch := fs.Bool("watch", false, "Refresh every --interval until interrupted.")
	interval := fs.Duration("interval", 2*time.Second, "Refresh period with --watch.")
	output := fs.String("output", "table", "table, or json for scripts.")
	if err := fs.Parse(args); err != nil {
		usageError(stderr, "status", err)
		return exitUsage
	}
	if *epp == "" || fs.NArg() > 0 || (*output != "table" && *output != "json") || *interval <= 0 {
		usageError(stderr, "status", fmt.Errorf("want --epp HOST:PORT, --output table or json, a positive --interval, no arguments"))
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	url := "http://" + *epp + status.Path
	client := &http.Client{Timeout: 10 * time.Second}
	for {
		p, raw, err := fetchStatus(ctx, client, url)
		if err != nil {
			fmt.Fprintf(stderr, "laneway status: %v\n", err)
			return exitInvalid
		}
		if *watch && *output == "table" {
			fmt.Fprint(stdout, "\x1b[H\x1b[2J") // home and clear, as watch(1) does
		}
		if *output == "json" {
			stdout.Write(raw)
		} else {
			status.Render(stdout, p)
		}
		if !*watch {
			return exitOK
		}
		select {
		case <-ctx.Done():
			return exitOK
		case <-time.After(*interval):
		}
	}
}

func fetchStatus(ctx context.Context, c *http.Client, url string) (*status.Page, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("%s answered %s: %s", url, resp.Status, raw)
	}
	var p status.Page
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, nil, fmt.Errorf("%s: not a status page: %w", url, err)
	}
	return &p, raw, nil
}
