package simulate

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestOneSchedulerCore holds the simulator to the architecture's rule that
// there is no second copy of admission or DRR logic anywhere: its build
// graph contains the picker's own core (pkg/sched over pkg/drr), it does not
// import pkg/drr itself (so it cannot assemble a scheduler of its own from
// drr's parts), and none of its code declares a queue, a probe or a
// deficit (the shapes a copied scheduler would have).
func TestOneSchedulerCore(t *testing.T) {
	const mod = "github.com/laneway-dev/laneway/"
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Skipf("go list not available: %v", err)
	}
	deps := strings.Fields(string(out))
	for _, want := range []string{mod + "pkg/sched", mod + "pkg/drr", mod + "pkg/engine", mod + "pkg/policy"} {
		if !slices.Contains(deps, want) {
			t.Errorf("the simulator does not build on %s", want)
		}
	}
	imports, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(strings.Fields(string(imports)), mod+"pkg/drr") {
		t.Error("the simulator imports pkg/drr directly: it must reach DRR only through pkg/sched's core")
	}

	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	forbidden := map[string]bool{"Offer": true, "Pop": true, "Shared": true, "Lane": true, "Admit": true, "Drain": true}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				if n.Recv != nil && forbidden[n.Name.Name] {
					t.Errorf("%s: method %s: the simulator must not implement a scheduler's surface", fset.Position(n.Pos()), n.Name.Name)
				}
			case *ast.Ident:
				if strings.Contains(strings.ToLower(n.Name), "deficit") {
					t.Errorf("%s: %s: DRR state belongs to pkg/drr", fset.Position(n.Pos()), n.Name)
				}
			}
			return true
		})
	}
	if checked < 5 {
		t.Fatalf("checked %d files; the test is not looking at the package", checked)
	}
}
