package terraform

import (
	"path/filepath"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// tfModule is one directory of .tf files, indexed by what references name.
type tfModule struct {
	dir       string
	bodies    []*hclsyntax.Body
	variables map[string]*hclsyntax.Block
	locals    map[string]*hclsyntax.Attribute
	modules   map[string]*hclsyntax.Block
	outputs   map[string]bool
}

func loadModule(t *testing.T, dir string) *tfModule {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.tf"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("%s: no .tf files (%v)", dir, err)
	}
	m := &tfModule{dir: dir, variables: map[string]*hclsyntax.Block{}, locals: map[string]*hclsyntax.Attribute{},
		modules: map[string]*hclsyntax.Block{}, outputs: map[string]bool{}}
	p := hclparse.NewParser()
	for _, path := range paths {
		f, diags := p.ParseHCLFile(path)
		if diags.HasErrors() {
			t.Fatalf("%s: %v", path, diags)
		}
		body := f.Body.(*hclsyntax.Body)
		m.bodies = append(m.bodies, body)
		for _, b := range body.Blocks {
			switch b.Type {
			case "variable":
				m.variables[b.Labels[0]] = b
			case "module":
				m.modules[b.Labels[0]] = b
			case "output":
				m.outputs[b.Labels[0]] = true
			case "locals":
				for name, attr := range b.Body.Attributes {
					if _, dup := m.locals[name]; dup {
						t.Errorf("%s: local %q defined twice", attr.SrcRange, name)
					}
					m.locals[name] = attr
				}
			}
		}
	}
	return m
}

// attributes returns every attribute of the module, at any depth.
func (m *tfModule) attributes() []*hclsyntax.Attribute {
	var attrs []*hclsyntax.Attribute
	var walk func(*hclsyntax.Body)
	walk = func(b *hclsyntax.Body) {
		for _, a := range b.Attributes {
			attrs = append(attrs, a)
		}
		for _, child := range b.Blocks {
			walk(child.Body)
		}
	}
	for _, b := range m.bodies {
		walk(b)
	}
	return attrs
}

// blocks returns every block of the given type, at any depth.
func (m *tfModule) blocks(typ string) []*hclsyntax.Block {
	var found []*hclsyntax.Block
	var walk func(*hclsyntax.Body)
	walk = func(b *hclsyntax.Body) {
		for _, child := range b.Blocks {
			if child.Type == typ {
				found = append(found, child)
			}
			walk(child.Body)
		}
	}
	for _, b := range m.bodies {
		walk(b)
	}
	return found
}

// resolve follows an expression that is just local.NAME to NAME's definition.
func (m *tfModule) resolve(e hclsyntax.Expression) hclsyntax.Expression {
	for range 10 {
		st, ok := e.(*hclsyntax.ScopeTraversalExpr)
		if !ok || st.Traversal.RootName() != "local" || len(st.Traversal) != 2 {
			return e
		}
		a, ok := st.Traversal[1].(hcl.TraverseAttr)
		if !ok || m.locals[a.Name] == nil {
			return e
		}
		e = m.locals[a.Name].Expr
	}
	return e
}

// attrString returns the literal string value of a body's attribute.
func attrString(b *hclsyntax.Body, name string) (string, bool) {
	a, ok := b.Attributes[name]
	if !ok {
		return "", false
	}
	return literalString(a.Expr)
}

// literalString returns the value of a string expression with no
// references (a quoted string, or a template's literal part).
func literalString(e hcl.Expression) (string, bool) {
	if e == nil || len(e.Variables()) > 0 {
		return "", false
	}
	var s string
	if diags := gohcl.DecodeExpression(e, nil, &s); diags.HasErrors() {
		return "", false
	}
	return s, true
}
