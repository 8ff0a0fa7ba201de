package terraform_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/hcl/v2/hclwrite"
	"github.com/zclconf/go-cty/cty"
)

// module is one directory of .tf files, parsed: what it declares and what it references.
type module struct {
	dir       string
	files     map[string][]byte // name -> source
	bodies    map[string]*hclsyntax.Body
	variables map[string]*hclsyntax.Block
	outputs   map[string]*hclsyntax.Block
	resources map[string]*hclsyntax.Block // "type.name"
	data      map[string]*hclsyntax.Block // "type.name"
	modules   map[string]*hclsyntax.Block
	locals    map[string]*hclsyntax.Attribute
	refs      []ref
}

// ref is one reference (a traversal) in the module, with where it is and what it may name
// besides the module's declarations.
type ref struct {
	trav  hcl.Traversal
	block string          // the top-level block it is in, e.g. `resource "aws_instance" "driver"`
	extra map[string]bool // roots made by dynamic blocks, count and for_each
}

func (r ref) String() string {
	return fmt.Sprintf("%s (%s, in %s)", traversalString(r.trav), r.trav.SourceRange(), r.block)
}

// loadModule parses every .tf file of dir (not of its subdirectories).
func loadModule(dir string) (*module, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.tf"))
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%s: no .tf files", dir)
	}
	m := &module{
		dir: dir, files: map[string][]byte{}, bodies: map[string]*hclsyntax.Body{},
		variables: map[string]*hclsyntax.Block{}, outputs: map[string]*hclsyntax.Block{},
		resources: map[string]*hclsyntax.Block{}, data: map[string]*hclsyntax.Block{},
		modules: map[string]*hclsyntax.Block{}, locals: map[string]*hclsyntax.Attribute{},
	}
	var errs []string
	for _, name := range names {
		src, err := os.ReadFile(name)
		if err != nil {
			return nil, err
		}
		f, diags := hclsyntax.ParseConfig(src, name, hcl.InitialPos)
		if diags.HasErrors() {
			errs = append(errs, diags.Error())
			continue
		}
		base := filepath.Base(name)
		m.files[base] = src
		m.bodies[base] = f.Body.(*hclsyntax.Body)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	for _, base := range sortedKeys(m.bodies) {
		for _, b := range m.bodies[base].Blocks {
			if err := m.declare(b); err != nil {
				errs = append(errs, err.Error())
			}
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	return m, nil
}

func (m *module) declare(b *hclsyntax.Block) error {
	where := b.DefRange().String()
	put := func(into map[string]*hclsyntax.Block, key string) error {
		if into[key] != nil {
			return fmt.Errorf("%s: %s %q declared twice", where, b.Type, key)
		}
		into[key] = b
		return nil
	}
	label := blockName(b)
	var extra map[string]bool
	switch b.Type {
	case "variable":
		return put(m.variables, b.Labels[0])
	case "output":
		m.walk(b.Body, label, nil)
		return put(m.outputs, b.Labels[0])
	case "module":
		m.walk(b.Body, label, nil)
		return put(m.modules, b.Labels[0])
	case "locals":
		for name, a := range b.Body.Attributes {
			if m.locals[name] != nil {
				return fmt.Errorf("%s: local %q declared twice", where, name)
			}
			m.locals[name] = a
		}
		m.walk(b.Body, label, nil)
		return nil
	case "resource", "data":
		if len(b.Labels) != 2 {
			return fmt.Errorf("%s: %s needs two labels", where, b.Type)
		}
		extra = map[string]bool{"self": b.Type == "resource"}
		if b.Body.Attributes["count"] != nil {
			extra["count"] = true
		}
		if b.Body.Attributes["for_each"] != nil {
			extra["each"] = true
		}
		m.walk(b.Body, label, extra)
		if b.Type == "data" {
			return put(m.data, b.Labels[0]+"."+b.Labels[1])
		}
		return put(m.resources, b.Labels[0]+"."+b.Labels[1])
	case "terraform", "provider", "moved", "import", "check":
		m.walk(b.Body, label, nil)
		return nil
	}
	return fmt.Errorf("%s: unknown top-level block %q", where, b.Type)
}

// walk records the references of every expression in body. A dynamic block's iterator is a
// name its content may use.
func (m *module) walk(body *hclsyntax.Body, block string, extra map[string]bool) {
	for _, name := range sortedKeys(body.Attributes) {
		if name == "ignore_changes" { // lifecycle's: attribute names, not references
			continue
		}
		for _, t := range body.Attributes[name].Expr.Variables() {
			m.refs = append(m.refs, ref{trav: t, block: block, extra: extra})
		}
	}
	for _, b := range body.Blocks {
		inner := extra
		if b.Type == "dynamic" && len(b.Labels) == 1 {
			inner = map[string]bool{}
			for k, v := range extra {
				inner[k] = v
			}
			it := b.Labels[0]
			if a := b.Body.Attributes["iterator"]; a != nil {
				it = hcl.ExprAsKeyword(a.Expr)
			}
			inner[it] = true
			// for_each of the dynamic block itself is outside the iterator's scope.
			if a := b.Body.Attributes["for_each"]; a != nil {
				for _, t := range a.Expr.Variables() {
					m.refs = append(m.refs, ref{trav: t, block: block, extra: extra})
				}
			}
			for _, c := range b.Body.Blocks {
				m.walk(c.Body, block, inner)
			}
			continue
		}
		m.walk(b.Body, block, inner)
	}
}

// checkReferences reports every reference to something the module does not declare.
func (m *module) checkReferences() []string {
	var bad []string
	for _, r := range m.refs {
		root := r.trav.RootName()
		name := func(i int) string {
			if i >= len(r.trav) {
				return ""
			}
			if a, ok := r.trav[i].(hcl.TraverseAttr); ok {
				return a.Name
			}
			return ""
		}
		switch {
		case r.extra[root]:
		case root == "path" || root == "terraform":
		case root == "var":
			if m.variables[name(1)] == nil {
				bad = append(bad, fmt.Sprintf("undeclared variable %s", r))
			}
		case root == "local":
			if m.locals[name(1)] == nil {
				bad = append(bad, fmt.Sprintf("undeclared local %s", r))
			}
		case root == "module":
			if m.modules[name(1)] == nil {
				bad = append(bad, fmt.Sprintf("undeclared module %s", r))
			}
		case root == "data":
			if m.data[name(1)+"."+name(2)] == nil {
				bad = append(bad, fmt.Sprintf("undeclared data source %s", r))
			}
		case root == "count" || root == "each" || root == "self":
			bad = append(bad, fmt.Sprintf("%s outside a block that defines it: %s", root, r))
		default:
			if m.resources[root+"."+name(1)] == nil {
				bad = append(bad, fmt.Sprintf("undeclared resource %s", r))
			}
		}
	}
	return bad
}

// checkVariables reports variables never referenced and variables without a description.
func (m *module) checkVariables() []string {
	used := map[string]bool{}
	for _, r := range m.refs {
		if r.trav.RootName() == "var" && len(r.trav) > 1 {
			if a, ok := r.trav[1].(hcl.TraverseAttr); ok {
				used[a.Name] = true
			}
		}
	}
	var bad []string
	for _, name := range sortedKeys(m.variables) {
		if !used[name] {
			bad = append(bad, fmt.Sprintf("variable %q is declared (%s) but never used", name, m.variables[name].DefRange()))
		}
		if !hasDescription(m.variables[name]) {
			bad = append(bad, fmt.Sprintf("variable %q has no description", name))
		}
	}
	for _, name := range sortedKeys(m.outputs) {
		if !hasDescription(m.outputs[name]) {
			bad = append(bad, fmt.Sprintf("output %q has no description", name))
		}
		if m.outputs[name].Body.Attributes["value"] == nil {
			bad = append(bad, fmt.Sprintf("output %q has no value", name))
		}
	}
	return bad
}

// checkValidations reports each variable that must be validated and is not: numbers (the
// instance and worker counts), URLs and CIDR blocks.
func (m *module) checkValidations() []string {
	var bad []string
	for _, name := range sortedKeys(m.variables) {
		b := m.variables[name]
		typ := ""
		if a := b.Body.Attributes["type"]; a != nil {
			typ = hcl.ExprAsKeyword(a.Expr)
		}
		key := typ == "number" || strings.HasSuffix(name, "_url") || strings.Contains(name, "cidr")
		if !key || hasValidation(b) {
			continue
		}
		// Validated where it goes: passed to a module whose variable has the validation
		// (the job's settings, which modules/elasticd-job validates for every cloud).
		if slices.ContainsFunc(m.feeds(name), func(f feed) bool { return hasValidation(f.target) }) {
			continue
		}
		bad = append(bad, fmt.Sprintf("variable %q (%s) has no validation block", name, b.DefRange()))
	}
	return bad
}

func hasValidation(b *hclsyntax.Block) bool {
	return slices.ContainsFunc(b.Body.Blocks, func(c *hclsyntax.Block) bool { return c.Type == "validation" })
}

// feed is one argument of a call to a local module, and the variable of that module it sets.
type feed struct {
	call, arg string
	expr      hclsyntax.Expression
	target    *hclsyntax.Block
}

// feeds lists the arguments of m's calls to local modules whose value reads var.name, directly
// or through locals, and that the called module declares.
func (m *module) feeds(name string) []feed {
	var out []feed
	for _, call := range sortedKeys(m.modules) {
		target, err := m.called(call)
		if err != nil {
			continue // checkModuleCalls reports it
		}
		b := m.modules[call]
		for _, arg := range sortedKeys(b.Body.Attributes) {
			v := target.variables[arg]
			if v == nil {
				continue
			}
			if e := b.Body.Attributes[arg].Expr; m.reads(e, name, map[string]bool{}) {
				out = append(out, feed{call: call, arg: arg, expr: e, target: v})
			}
		}
	}
	return out
}

// reads reports whether e reads var.name, directly or through the locals it reads.
func (m *module) reads(e hclsyntax.Expression, name string, seen map[string]bool) bool {
	for _, t := range e.Variables() {
		if len(t) < 2 {
			continue
		}
		attr, ok := t[1].(hcl.TraverseAttr)
		if !ok {
			continue
		}
		switch t.RootName() {
		case "var":
			if attr.Name == name {
				return true
			}
		case "local":
			if l := m.locals[attr.Name]; l != nil && !seen[attr.Name] {
				seen[attr.Name] = true
				if m.reads(l.Expr, name, seen) {
					return true
				}
			}
		}
	}
	return false
}

// called loads the module that m's module block call names by a relative source.
func (m *module) called(call string) (*module, error) {
	b := m.modules[call]
	if b == nil {
		return nil, fmt.Errorf("no module %q", call)
	}
	src := ""
	if a := b.Body.Attributes["source"]; a != nil {
		if v, diags := a.Expr.Value(nil); !diags.HasErrors() && v.Type() == cty.String {
			src = v.AsString()
		}
	}
	if !strings.HasPrefix(src, "./") && !strings.HasPrefix(src, "../") {
		return nil, fmt.Errorf("module %q: source %q is not a relative path", call, src)
	}
	target, err := loadModule(filepath.Join(m.dir, src))
	if err != nil {
		return nil, fmt.Errorf("module %q: %v", call, err)
	}
	return target, nil
}

// checkFormat reports each file that `terraform fmt` would change.
func checkFormat(name string, src []byte) string {
	if got := hclwrite.Format(src); string(got) != string(src) {
		return fmt.Sprintf("%s is not formatted (terraform fmt would change line %d)", name, firstDiffLine(src, got))
	}
	return ""
}

func firstDiffLine(a, b []byte) int {
	la, lb := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := range min(len(la), len(lb)) {
		if la[i] != lb[i] {
			return i + 1
		}
	}
	return min(len(la), len(lb)) + 1
}

// checkTemplates reports each templatefile call whose variables differ from its template's.
func (m *module) checkTemplates() []string {
	var bad []string
	for _, base := range sortedKeys(m.bodies) {
		hclsyntax.VisitAll(m.bodies[base], func(n hclsyntax.Node) hcl.Diagnostics {
			call, ok := n.(*hclsyntax.FunctionCallExpr)
			if !ok || call.Name != "templatefile" {
				return nil
			}
			if len(call.Args) != 2 {
				bad = append(bad, fmt.Sprintf("%s: templatefile needs 2 arguments", call.Range()))
				return nil
			}
			path, ok := modulePath(call.Args[0])
			if !ok {
				bad = append(bad, fmt.Sprintf("%s: templatefile's path must be \"${path.module}/...\"", call.Range()))
				return nil
			}
			obj, ok := call.Args[1].(*hclsyntax.ObjectConsExpr)
			if !ok {
				bad = append(bad, fmt.Sprintf("%s: templatefile's variables must be an object literal", call.Range()))
				return nil
			}
			given := map[string]bool{}
			for _, it := range obj.Items {
				given[hcl.ExprAsKeyword(it.KeyExpr)] = true
			}
			src, err := os.ReadFile(filepath.Join(m.dir, path))
			if err != nil {
				bad = append(bad, fmt.Sprintf("%s: %v", call.Range(), err))
				return nil
			}
			tmpl, diags := hclsyntax.ParseTemplate(src, path, hcl.InitialPos)
			if diags.HasErrors() {
				bad = append(bad, fmt.Sprintf("%s: %s", path, diags.Error()))
				return nil
			}
			needed := map[string]bool{}
			for _, t := range tmpl.Variables() {
				needed[t.RootName()] = true
			}
			for _, k := range sortedKeys(needed) {
				if !given[k] {
					bad = append(bad, fmt.Sprintf("%s uses ${%s}, which the templatefile call at %s does not pass", path, k, call.Range()))
				}
			}
			for _, k := range sortedKeys(given) {
				if !needed[k] {
					bad = append(bad, fmt.Sprintf("the templatefile call at %s passes %q, which %s never uses", call.Range(), k, path))
				}
			}
			return nil
		})
	}
	return bad
}

// modulePath reads "${path.module}/rest" and returns rest.
func modulePath(e hclsyntax.Expression) (string, bool) {
	t, ok := e.(*hclsyntax.TemplateExpr)
	if !ok || len(t.Parts) != 2 {
		return "", false
	}
	st, ok := t.Parts[0].(*hclsyntax.ScopeTraversalExpr)
	if !ok || traversalString(st.Traversal) != "path.module" {
		return "", false
	}
	v, diags := t.Parts[1].Value(nil)
	if diags.HasErrors() || v.Type() != cty.String || !strings.HasPrefix(v.AsString(), "/") {
		return "", false
	}
	return strings.TrimPrefix(v.AsString(), "/"), true
}

// checkModuleCalls checks each module block of m (an example root module) against the module it
// calls: a relative source that exists, only declared variables passed, every required one
// passed, and only existing outputs read.
func (m *module) checkModuleCalls() []string {
	var bad []string
	for _, name := range sortedKeys(m.modules) {
		b := m.modules[name]
		target, err := m.called(name)
		if err != nil {
			bad = append(bad, err.Error())
			continue
		}
		meta := map[string]bool{"source": true, "version": true, "providers": true, "count": true, "for_each": true, "depends_on": true}
		for _, arg := range sortedKeys(b.Body.Attributes) {
			if !meta[arg] && target.variables[arg] == nil {
				bad = append(bad, fmt.Sprintf("module %q passes %q, which %s does not declare", name, arg, target.dir))
			}
		}
		for _, v := range sortedKeys(target.variables) {
			if target.variables[v].Body.Attributes["default"] == nil && b.Body.Attributes[v] == nil {
				bad = append(bad, fmt.Sprintf("module %q does not pass %q, which %s requires", name, v, target.dir))
			}
		}
		for _, r := range m.refs {
			if r.trav.RootName() != "module" || len(r.trav) < 3 {
				continue
			}
			mod, _ := r.trav[1].(hcl.TraverseAttr)
			out, _ := r.trav[2].(hcl.TraverseAttr)
			if mod.Name == name && target.outputs[out.Name] == nil {
				bad = append(bad, fmt.Sprintf("%s reads output %q, which %s does not declare", r, out.Name, target.dir))
			}
		}
	}
	return bad
}

// attrStrings evaluates a literal list of strings (no references).
func attrStrings(b *hclsyntax.Body, name string) ([]string, error) {
	a := b.Attributes[name]
	if a == nil {
		return nil, nil
	}
	v, diags := a.Expr.Value(nil)
	if diags.HasErrors() {
		return nil, fmt.Errorf("%s: %s must be a literal list of strings: %s", a.SrcRange, name, diags.Error())
	}
	if !v.Type().IsTupleType() && !v.Type().IsListType() {
		return nil, fmt.Errorf("%s: %s must be a list of strings", a.SrcRange, name)
	}
	var out []string
	for it := v.ElementIterator(); it.Next(); {
		_, e := it.Element()
		if e.Type() != cty.String || e.IsNull() {
			return nil, fmt.Errorf("%s: %s must hold only strings", a.SrcRange, name)
		}
		out = append(out, e.AsString())
	}
	return out, nil
}

func hasDescription(b *hclsyntax.Block) bool {
	a := b.Body.Attributes["description"]
	if a == nil {
		return false
	}
	v, diags := a.Expr.Value(nil)
	return !diags.HasErrors() && v.Type() == cty.String && strings.TrimSpace(v.AsString()) != ""
}

func blockName(b *hclsyntax.Block) string {
	s := b.Type
	for _, l := range b.Labels {
		s += fmt.Sprintf(" %q", l)
	}
	return s
}

func traversalString(t hcl.Traversal) string {
	var sb strings.Builder
	for i, s := range t {
		switch s := s.(type) {
		case hcl.TraverseRoot:
			sb.WriteString(s.Name)
		case hcl.TraverseAttr:
			sb.WriteString("." + s.Name)
		case hcl.TraverseIndex:
			sb.WriteString("[…]")
		default:
			if i > 0 {
				sb.WriteString("…")
			}
		}
	}
	return sb.String()
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
