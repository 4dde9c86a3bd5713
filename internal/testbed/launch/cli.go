package launch

import (
	"encoding/json"
	"os/exec"

	"github.com/laneway-dev/laneway/internal/status"
)

// RunLaneway runs the operator CLI (b.Laneway) with args and returns what
// it printed; an error exit fails t with that output.
func (b Binaries) RunLaneway(t TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(b.Laneway, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("laneway %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// StatusPage is p's status page as `laneway status --output json` prints
// it.
func (b Binaries) StatusPage(t TB, p *EPP) status.Page {
	t.Helper()
	var page status.Page
	out := b.RunLaneway(t, "status", "--epp", p.StatusAddr, "--output", "json")
	if err := json.Unmarshal([]byte(out), &page); err != nil {
		t.Fatalf("laneway status --output json: %v\n%s", err, out)
	}
	return page
}
