package terraform_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

// cliFlags collects the flag names (and aliases) of the function fn in the Go package in dir,
// as urfave/cli declares them: &cli.XxxFlag{Name: "...", Aliases: []string{...}}, a helper
// call str("name", ...) that builds one, and, followed into, calls of the package's other
// functions (providerFlags()).
func cliFlags(dir, fn string) ([]string, error) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi fs.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		return nil, err
	}
	funcs := map[string]*ast.FuncDecl{}
	for _, p := range pkgs {
		for _, f := range p.Files {
			for _, d := range f.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil {
					funcs[fd.Name.Name] = fd
				}
			}
		}
	}
	str := func(e ast.Expr) (string, bool) {
		if l, ok := e.(*ast.BasicLit); ok && l.Kind == token.STRING {
			s, err := strconv.Unquote(l.Value)
			return s, err == nil
		}
		return "", false
	}
	var out []string
	seen := map[string]bool{}
	var visit func(name string) error
	visit = func(name string) error {
		fd := funcs[name]
		if fd == nil {
			return fmt.Errorf("%s: no func %s", dir, name)
		}
		seen[name] = true
		var err error
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CompositeLit:
				sel, ok := n.Type.(*ast.SelectorExpr)
				if !ok || !strings.HasSuffix(sel.Sel.Name, "Flag") {
					return true
				}
				for _, elt := range n.Elts {
					kv, ok := elt.(*ast.KeyValueExpr)
					if !ok {
						continue
					}
					switch key, _ := kv.Key.(*ast.Ident); {
					case key == nil:
					case key.Name == "Name":
						if s, ok := str(kv.Value); ok {
							out = append(out, s)
						}
					case key.Name == "Aliases":
						if cl, ok := kv.Value.(*ast.CompositeLit); ok {
							for _, a := range cl.Elts {
								if s, ok := str(a); ok {
									out = append(out, s)
								}
							}
						}
					}
				}
			case *ast.CallExpr:
				id, ok := n.Fun.(*ast.Ident)
				if !ok {
					return true
				}
				if id.Name == "str" && len(n.Args) > 0 {
					if s, ok := str(n.Args[0]); ok {
						out = append(out, s)
					}
				} else if funcs[id.Name] != nil && !seen[id.Name] && strings.HasSuffix(id.Name, "Flags") {
					if e := visit(id.Name); e != nil {
						err = e
					}
				}
			}
			return true
		})
		return err
	}
	if err := visit(fn); err != nil {
		return nil, err
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// flagLists are the lists of driver_flags' validations in the shared module: the flags the
// modules set themselves ("must not set"), those of --provider sim, a cloud on one machine that
// a cloud's cluster has no use for ("--provider sim"), the fallback groups of the clouds whose
// module creates none ("do not create a fallback group"), all refused, and every flag of
// elasticd run ("does not have").
type flagLists struct {
	set, sim, fallback, known []string
}

// refused is every flag driver_flags refuses.
func (l flagLists) refused() []string { return slices.Concat(l.set, l.sim, l.fallback) }

// driverFlagLists reads the lists of driver_flags' validations, each by its error message.
func driverFlagLists(m *module) (flagLists, error) {
	var l flagLists
	v := m.variables["driver_flags"]
	if v == nil {
		return l, fmt.Errorf("%s has no variable driver_flags", m.dir)
	}
	for _, b := range v.Body.Blocks {
		if b.Type != "validation" {
			continue
		}
		msg, _ := attrString(b.Body, "error_message")
		var list []string
		hclsyntax.VisitAll(b.Body.Attributes["condition"].Expr, func(n hclsyntax.Node) hcl.Diagnostics {
			if tup, ok := n.(*hclsyntax.TupleConsExpr); ok && len(tup.Exprs) >= 3 {
				for _, e := range tup.Exprs {
					if val, diags := e.Value(nil); !diags.HasErrors() && val.Type() == cty.String {
						list = append(list, val.AsString())
					}
				}
			}
			return nil
		})
		switch {
		case strings.Contains(msg, "must not set"):
			l.set = list
		case strings.Contains(msg, "--provider sim"):
			l.sim = list
		case strings.Contains(msg, "do not create a fallback group"):
			l.fallback = list
		case strings.Contains(msg, "does not have"):
			l.known = list
		}
	}
	if len(l.set) == 0 || len(l.sim) == 0 || len(l.known) == 0 {
		return l, fmt.Errorf("%s: driver_flags needs a validation refusing the modules' own flags (\"must not set\"), one refusing those of --provider sim (\"--provider sim\") and one refusing what is no flag of elasticd run (\"does not have\")", m.dir)
	}
	return l, nil
}

// compareFlags reports where the module's two lists and the CLI's flags disagree: known must
// be the CLI's flags, and refused some of them ("" stands for "--", the end of the flags).
func compareFlags(cliNames, refused, known []string) []string {
	var bad []string
	for _, f := range refused {
		if f != "" && !slices.Contains(cliNames, f) {
			bad = append(bad, fmt.Sprintf("driver_flags refuses %q, which is not a flag of elasticd run", f))
		}
	}
	for _, f := range known {
		if !slices.Contains(cliNames, f) {
			bad = append(bad, fmt.Sprintf("driver_flags knows %q, which is not a flag of elasticd run", f))
		}
	}
	for _, f := range cliNames {
		if !slices.Contains(known, f) {
			bad = append(bad, fmt.Sprintf("elasticd run has the flag %q, which driver_flags does not know: add it to the list of %s/variables.tf (and to the refused ones if the modules set it)", f, sharedModule))
		}
	}
	return bad
}

// compareFallbackFlags reports each fallback group flag of the CLI that driver_flags does not
// refuse exactly once: as a flag the modules set (a module creates the group and writes it),
// or as the group of a cloud whose module creates none.
func compareFallbackFlags(cliNames []string, l flagLists) []string {
	var bad []string
	for _, f := range cliNames {
		if !strings.HasPrefix(f, "fallback-") {
			continue
		}
		set, none := slices.Contains(l.set, f), slices.Contains(l.fallback, f)
		if set == none {
			bad = append(bad, fmt.Sprintf("driver_flags refuses --%s as a flag the modules set: %v, as a fallback group they do not create: %v; want exactly one", f, set, none))
		}
	}
	return bad
}

// TestDriverFlagsMatchCLI: the flags driver_flags knows are exactly the flags of `elasticd run`
// (cmd/elasticd); it refuses every flag the modules write, and every flag of --provider sim.
func TestDriverFlagsMatchCLI(t *testing.T) {
	cliNames, err := cliFlags(filepath.Join("..", "cmd", "elasticd"), "runCommand")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(cliNames, "reset-limit") || !slices.Contains(cliNames, "asg") || !slices.Contains(cliNames, "H") {
		t.Fatalf("found the flags %v in cmd/elasticd: the collector no longer understands how they are declared", cliNames)
	}
	shared, err := loadModule(sharedModule)
	if err != nil {
		t.Fatal(err)
	}
	lists, err := driverFlagLists(shared)
	if err != nil {
		t.Fatal(err)
	}
	refused := lists.refused()
	for _, msg := range compareFlags(cliNames, refused, lists.known) {
		t.Error(msg)
	}
	// --provider sim's flags (cmd/elasticd's simFlags) describe a cloud on one machine: each is
	// refused, with the message that says so.
	simNames, err := cliFlags(filepath.Join("..", "cmd", "elasticd"), "simFlags")
	if err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(slices.Values(lists.sim)); !slices.Equal(got, simNames) {
		t.Errorf("driver_flags refuses %v as --provider sim's flags, but elasticd run's are %v", got, simNames)
	}
	// What the modules write: the shared module's job flags, each cloud's provider flags and
	// its fallback group's (the AWS module's on_demand_fallback).
	written := literalStrings(shared.locals["driver_args"].Expr)
	for _, c := range clouds {
		written = append(written, c.wantArgs...)
		m, err := loadModule(c.name)
		if err != nil {
			t.Fatal(err)
		}
		if a := m.modules[sharedCall(t, m)].Body.Attributes["fallback_args"]; a != nil {
			written = append(written, literalStrings(a.Expr)...)
		}
	}
	for _, msg := range compareFallbackFlags(cliNames, lists) {
		t.Error(msg)
	}
	for _, w := range written {
		if f, ok := strings.CutPrefix(w, "-"); ok {
			if f = strings.TrimPrefix(f, "-"); !slices.Contains(refused, f) {
				t.Errorf("the modules write %s, which driver_flags does not refuse", w)
			}
		}
	}
}

// TestDriverFlagsCheckCanFail: a flag added to the CLI that the module does not know, a flag
// it knows or refuses that the CLI lacks, a fallback group flag refused twice or not at all,
// are each reported.
func TestDriverFlagsCheckCanFail(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "run.go", `package main

import "github.com/urfave/cli/v2"

func runCommand() *cli.Command {
	return &cli.Command{Name: "run", Flags: append(providerFlags(),
		&cli.IntFlag{Name: "np"},
		&cli.BoolFlag{Name: "verbose", Aliases: []string{"v"}},
		&cli.StringFlag{Name: "brand-new"},
	)}
}

func providerFlags() []cli.Flag {
	str := func(name, usage string) cli.Flag { return &cli.StringFlag{Name: name, Usage: usage} }
	return []cli.Flag{str("provider", "where"), &cli.StringFlag{Name: "hosts", Aliases: []string{"H"}}}
}
`)
	got, err := cliFlags(dir, "runCommand")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"H", "brand-new", "hosts", "np", "provider", "v", "verbose"}; !slices.Equal(got, want) {
		t.Fatalf("cliFlags: %v, want %v", got, want)
	}
	bad := compareFlags(got, []string{"", "provider", "hosts", "H", "np", "gone"}, []string{"H", "hosts", "np", "provider", "v", "verbose", "old"})
	for _, want := range []string{
		`"brand-new", which driver_flags does not know`,
		`refuses "gone", which is not a flag`,
		`knows "old", which is not a flag`,
	} {
		if !slices.ContainsFunc(bad, func(s string) bool { return strings.Contains(s, want) }) {
			t.Errorf("no problem reported containing %q; got:\n%s", want, strings.Join(bad, "\n"))
		}
	}
	if len(bad) != 3 {
		t.Errorf("%d problems, want 3:\n%s", len(bad), strings.Join(bad, "\n"))
	}

	// A fallback group flag refused twice, one not refused, and one refused once.
	bad = compareFallbackFlags([]string{"fallback-asg", "fallback-mig", "fallback-vmss", "np"},
		flagLists{set: []string{"fallback-asg", "np"}, fallback: []string{"fallback-asg", "fallback-vmss"}})
	if len(bad) != 2 || !strings.Contains(bad[0], "--fallback-asg as a flag the modules set: true, as a fallback group they do not create: true") ||
		!strings.Contains(bad[1], "--fallback-mig as a flag the modules set: false, as a fallback group they do not create: false") {
		t.Errorf("fallback group flags refused twice and not at all: %q", bad)
	}
}
