package launch

import (
	"encoding/json"
	"os/exec"
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

// ReadStatus decodes p's status page, as `laneway status --output json`
// prints it, into page (a *status.Page: this package cannot import
// internal/status, whose dependencies' tests run processes through it).
func (b Binaries) ReadStatus(t TB, p *EPP, page any) {
	t.Helper()
	out := b.RunLaneway(t, "status", "--epp", p.StatusAddr, "--output", "json")
	if err := json.Unmarshal([]byte(out), page); err != nil {
		t.Fatalf("laneway status --output json: %v\n%s", err, out)
	}
}
