package rules

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The rules do no I/O and read no clock: the cluster's loops that talk to
// Serf, Raft, the network and the store call them with what they saw and
// the time. These tests hold the package (and whatever of this module it
// imports) to that.

const module = "github.com/peatmq/peat"

// forbidden reports whether importing path breaks the rule.
func forbidden(path string) bool {
	switch {
	case path == "net", strings.HasPrefix(path, "net/"):
		return true
	case path == "github.com/hashicorp/raft", strings.HasPrefix(path, "github.com/hashicorp/raft/"):
		return true
	case path == "github.com/hashicorp/serf", strings.HasPrefix(path, "github.com/hashicorp/serf/"):
		return true
	case path == module+"/logstore", strings.HasPrefix(path, module+"/logstore/"):
		return true
	}
	return false
}

// clockCalls are the time package's functions that read or wait on the
// clock.
var clockCalls = map[string]bool{
	"Now": true, "Since": true, "Until": true, "After": true, "AfterFunc": true,
	"Sleep": true, "NewTimer": true, "NewTicker": true, "Tick": true,
}

type listed struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Imports    []string
	Standard   bool
}

// ownDeps are this package and the packages of this module it imports,
// directly or not, as go list reports them.
func ownDeps(t *testing.T) []listed {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-json", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []listed
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p listed
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if p.ImportPath == module || strings.HasPrefix(p.ImportPath, module+"/") {
			pkgs = append(pkgs, p)
		}
	}
	if len(pkgs) == 0 || pkgs[len(pkgs)-1].ImportPath != module+"/cluster/rules" {
		t.Fatalf("go list did not list this package last: %+v", pkgs)
	}
	return pkgs
}

// The package, and every package of this module it pulls in, imports no
// network, Raft, Serf or store package (third-party packages are judged
// by what this module imports of them, not by their own imports).
func TestRules_ImportNoIO(t *testing.T) {
	for _, p := range ownDeps(t) {
		if forbidden(p.ImportPath) {
			t.Errorf("the rules depend on %s", p.ImportPath)
		}
		for _, imp := range p.Imports {
			if forbidden(imp) {
				t.Errorf("%s imports %s", p.ImportPath, imp)
			}
		}
	}
}

// No file of the package, or of a package of this module it pulls in,
// reads or waits on the clock: time comes in as an argument.
func TestRules_ReadNoClock(t *testing.T) {
	for _, p := range ownDeps(t) {
		for _, name := range p.GoFiles {
			fn := filepath.Join(p.Dir, name)
			for _, call := range clockUses(t, fn, nil) {
				t.Errorf("%s", call)
			}
		}
	}
}

// clockUses are the clock calls in file fn (or in src, when given).
func clockUses(t *testing.T, fn string, src any) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, fn, src, 0)
	if err != nil {
		t.Fatal(err)
	}
	timeName := ""
	for _, imp := range f.Imports {
		if path, _ := strconv.Unquote(imp.Path.Value); path == "time" {
			timeName = "time"
			if imp.Name != nil {
				timeName = imp.Name.Name
			}
		}
	}
	if timeName == "" || timeName == "_" {
		return nil
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		// A use of the function, called or passed on (time.Now as a
		// func value reads the clock just the same).
		if x, ok := sel.X.(*ast.Ident); ok && x.Name == timeName && x.Obj == nil && clockCalls[sel.Sel.Name] {
			out = append(out, fset.Position(sel.Pos()).String()+": time."+sel.Sel.Name)
		}
		return true
	})
	return out
}

// The check finds what it looks for, under any import name.
func TestRules_ClockCheckFindsCalls(t *testing.T) {
	for src, want := range map[string]int{
		"package p\nimport \"time\"\nfunc f() time.Time { return time.Now() }":                                 1,
		"package p\nimport clock \"time\"\nvar now = clock.Now\nfunc g() { clock.Sleep(1); <-clock.After(1) }": 3,
		"package p\nimport \"time\"\nfunc f(now time.Time) time.Time { return now.Add(time.Second) }":          0,
		"package p\nfunc f(time struct{ Now int }) int { return time.Now }":                                    0,
	} {
		if got := clockUses(t, "src.go", src); len(got) != want {
			t.Errorf("%q: %v, want %d", src, got, want)
		}
	}
	for path, want := range map[string]bool{"net": true, "net/http": true, "github.com/hashicorp/raft": true,
		"github.com/hashicorp/serf/serf": true, module + "/logstore": true, "network": false, "time": false,
		module + "/cluster/wire": false} {
		if forbidden(path) != want {
			t.Errorf("forbidden(%s) = %v", path, !want)
		}
	}
}
