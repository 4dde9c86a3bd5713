package sched

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCoreHasNoClockGoroutinesOrChannels holds the package to its doc
// comment: the core reads no clock (time is an argument), starts no
// goroutine and uses no channel or select, so every driver (the live loop,
// the simulator, the fuzz target) runs the same deterministic code.
func TestCoreHasNoClockGoroutinesOrChannels(t *testing.T) {
	forbidden := map[string]bool{"Now": true, "Since": true, "Until": true, "After": true, "AfterFunc": true,
		"Tick": true, "NewTicker": true, "NewTimer": true, "Sleep": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt:
				t.Errorf("%s: go statement", fset.Position(n.Pos()))
			case *ast.ChanType:
				t.Errorf("%s: channel type", fset.Position(n.Pos()))
			case *ast.SelectStmt:
				t.Errorf("%s: select statement", fset.Position(n.Pos()))
			case *ast.SendStmt:
				t.Errorf("%s: channel send", fset.Position(n.Pos()))
			case *ast.UnaryExpr:
				if n.Op == token.ARROW {
					t.Errorf("%s: channel receive", fset.Position(n.Pos()))
				}
			case *ast.SelectorExpr:
				if id, ok := n.X.(*ast.Ident); ok && id.Name == "time" && forbidden[n.Sel.Name] {
					t.Errorf("%s: time.%s reads the clock", fset.Position(n.Pos()), n.Sel.Name)
				}
			}
			return true
		})
	}
	if checked < 5 {
		t.Fatalf("checked %d source files; the test is not looking at the package", checked)
	}
}
