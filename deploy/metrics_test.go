package deploy

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// repoRoot is the module's root, relative to this package.
const repoRoot = ".."

// pendingMetrics are documented in docs/METRICS.md but added by branches
// not merged yet when this test was written (issue 16): their definitions
// are not checked. Once merged, each is exported as documented and the test
// fails until it is removed from this list, which should end up empty.
var pendingMetrics = []string{}

// metricDef is one metric as the code defines it.
type metricDef struct {
	name string
	// typ is counter, gauge, histogram or summary; "" when the code does
	// not say where it names the metric (prometheus.NewDesc: the type is
	// chosen at collection).
	typ string
	// labels are the variable labels, known if labelsKnown (they may be
	// built at run time).
	labels      []string
	labelsKnown bool
	pos         string
}

// docMetric is one row of docs/METRICS.md.
type docMetric struct {
	name, typ string
	labels    []string
	// wanted: in the "Not exported yet" section.
	wanted bool
}

// TestMetricsDocumented checks docs/METRICS.md against the code: every
// metric the code exports has a row with its type and labels, and every
// row is a metric the code exports (but the pending and wanted ones).
func TestMetricsDocumented(t *testing.T) {
	code := codeMetrics(t)
	doc := docMetrics(t)
	pending := map[string]bool{}
	for _, n := range pendingMetrics {
		pending[n] = true
		if _, ok := doc[n]; !ok {
			t.Errorf("pendingMetrics: %s is not in docs/METRICS.md", n)
		}
	}
	for name, d := range doc {
		defs := code[name]
		switch {
		case d.wanted:
			if len(defs) > 0 {
				t.Errorf("docs/METRICS.md lists %s as not exported yet, but %s exports it: move it to its binary's table", name, defs[0].pos)
			}
			if pending[name] {
				t.Errorf("%s is both pending and not exported yet", name)
			}
		case pending[name]:
			if len(defs) > 0 && !slices.ContainsFunc(defs, func(c metricDef) bool { return mismatch(d, c) != "" }) {
				t.Errorf("pendingMetrics: %s is exported as documented now (%s): remove it from the list", name, defs[0].pos)
			}
		case len(defs) == 0:
			t.Errorf("docs/METRICS.md documents %s, but no code exports it", name)
		default:
			for _, c := range defs {
				if m := mismatch(d, c); m != "" {
					t.Errorf("%s (%s): %s", name, c.pos, m)
				}
			}
		}
	}
	for name, defs := range code {
		if d, ok := doc[name]; !ok || d.wanted {
			t.Errorf("%s (%s) is not in docs/METRICS.md's tables: document it", name, defs[0].pos)
		}
	}
}

// mismatch says how a documented metric differs from a definition, or "".
func mismatch(d docMetric, c metricDef) string {
	var diffs []string
	if c.typ != "" && c.typ != d.typ {
		diffs = append(diffs, fmt.Sprintf("got type %s in docs/METRICS.md, want %s", d.typ, c.typ))
	}
	if c.labelsKnown {
		want := slices.Sorted(slices.Values(c.labels))
		got := slices.Sorted(slices.Values(d.labels))
		if !slices.Equal(got, want) {
			diffs = append(diffs, fmt.Sprintf("got labels %q in docs/METRICS.md, want %q", got, want))
		}
	}
	return strings.Join(diffs, "; ")
}

// metricName is what a PromQL expression or a document calls a metric.
var metricName = regexp.MustCompile(`\bration_[a-z0-9_]*[a-z0-9]`)

// TestDashboardAndAlertMetricsDocumented checks that every metric the
// dashboard and the alert rules name is in docs/METRICS.md (a histogram's
// series by its name: X_bucket, X_sum and X_count are X).
func TestDashboardAndAlertMetricsDocumented(t *testing.T) {
	doc := docMetrics(t)
	for _, file := range []string{"grafana/ration.json", "prometheus/alerts.yaml", "prometheus/alerts_test.yaml"} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		names := metricName.FindAllString(string(b), -1)
		if len(names) == 0 {
			t.Errorf("%s: no ration_ metric found", file)
		}
		for _, name := range slices.Compact(slices.Sorted(slices.Values(names))) {
			if !documented(doc, name) {
				t.Errorf("%s names %s: got no such metric in docs/METRICS.md", file, name)
			}
		}
	}
}

func documented(doc map[string]docMetric, name string) bool {
	if _, ok := doc[name]; ok {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			d, ok := doc[base]
			return ok && (d.typ == "histogram" || (d.typ == "summary" && suffix != "_bucket"))
		}
	}
	return false
}

// docMetrics parses the tables of docs/METRICS.md: rows whose first cell
// is a metric name in backquotes.
func docMetrics(t *testing.T) map[string]docMetric {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "METRICS.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := map[string]docMetric{}
	wanted := false
	for i, line := range strings.Split(string(b), "\n") {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			wanted = h == "Not exported yet"
		}
		if !strings.HasPrefix(line, "| `ration_") {
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) != 6 {
			t.Errorf("docs/METRICS.md:%d: got %d cells, want 4 (metric, type, labels, meaning)", i+1, len(cells)-2)
			continue
		}
		d := docMetric{name: strings.Trim(strings.TrimSpace(cells[1]), "`"), typ: strings.TrimSpace(cells[2]), wanted: wanted}
		for _, l := range strings.Split(cells[3], ",") {
			if l = strings.Trim(strings.TrimSpace(l), "`"); l != "" {
				d.labels = append(d.labels, l)
			}
		}
		switch {
		case !metricName.MatchString(d.name) || metricName.FindString(d.name) != d.name:
			t.Errorf("docs/METRICS.md:%d: %q is not a metric name", i+1, d.name)
		case !slices.Contains([]string{"counter", "gauge", "histogram", "summary"}, d.typ):
			t.Errorf("docs/METRICS.md:%d: %s has type %q, want counter, gauge, histogram or summary", i+1, d.name, d.typ)
		case d.typ == "counter" && !strings.HasSuffix(d.name, "_total"), d.typ != "counter" && strings.HasSuffix(d.name, "_total"):
			t.Errorf("docs/METRICS.md:%d: %s is a %s: a name ends in _total if and only if it is a counter", i+1, d.name, d.typ)
		case strings.TrimSpace(cells[4]) == "":
			t.Errorf("docs/METRICS.md:%d: %s has no meaning", i+1, d.name)
		}
		if _, dup := doc[d.name]; dup {
			t.Errorf("docs/METRICS.md:%d: %s twice", i+1, d.name)
		}
		doc[d.name] = d
	}
	if len(doc) < 40 {
		t.Fatalf("docs/METRICS.md: got %d metrics, want the whole table", len(doc))
	}
	return doc
}

// codeMetrics returns the ration_ metrics that the module's non-test Go
// files define, by name. It reads two shapes: an options literal
// (prometheus.CounterOpts{Name: "ration_..."}, with its labels when it is
// the first argument of a NewXVec call), and prometheus.NewDesc, whose name
// is a literal or "ration_prefix_"+param of a function literal, which then
// defines one metric per call with a literal argument (lease/agent's
// d("decisions_total", help, "path", "outcome")). A definition in another
// shape fails the test rather than going unseen.
func codeMetrics(t *testing.T) map[string][]metricDef {
	t.Helper()
	code := map[string][]metricDef{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(repoRoot, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			if n := e.Name(); path != repoRoot && (strings.HasPrefix(n, ".") || n == "testdata" || n == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		for _, d := range fileMetrics(t, fset, f) {
			if strings.HasPrefix(d.name, "ration_") {
				code[d.name] = append(code[d.name], d)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A walk that found nothing would pass every check vacuously.
	for _, n := range []string{"ration_store_errors_total", "ration_exchange_share_ppm", "ration_agent_keys", "ration_agent_decision_seconds"} {
		if len(code[n]) == 0 {
			t.Fatalf("found no definition of %s: the reading of the code is broken", n)
		}
	}
	return code
}

var optsTypes = map[string]string{"CounterOpts": "counter", "GaugeOpts": "gauge", "HistogramOpts": "histogram", "SummaryOpts": "summary"}

// fileMetrics returns the metrics one file defines.
func fileMetrics(t *testing.T, fset *token.FileSet, f *ast.File) []metricDef {
	var defs []metricDef
	labelled := map[*ast.CompositeLit][]string{} // options literals passed to a New* call, with their labels
	var stack []ast.Node
	ast.Inspect(f, func(n ast.Node) bool {
		if n == nil {
			stack = stack[:len(stack)-1]
			return true
		}
		stack = append(stack, n)
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		switch name := sel.Sel.Name; {
		case name == "NewDesc":
			defs = append(defs, descMetrics(t, fset, call, stack)...)
		case strings.HasPrefix(name, "New") && len(call.Args) > 0:
			lit, ok := call.Args[0].(*ast.CompositeLit)
			if !ok {
				return true
			}
			switch {
			case strings.HasSuffix(name, "Vec") && len(call.Args) == 2:
				if labels, ok := stringList(call.Args[1]); ok {
					labelled[lit] = labels
				}
			case !strings.HasSuffix(name, "Vec"):
				labelled[lit] = []string{}
			}
		}
		return true
	})
	ast.Inspect(f, func(n ast.Node) bool {
		lit, ok := n.(*ast.CompositeLit)
		if !ok {
			return true
		}
		sel, ok := lit.Type.(*ast.SelectorExpr)
		if !ok || optsTypes[sel.Sel.Name] == "" {
			return true
		}
		parts := map[string]string{}
		for _, el := range lit.Elts {
			kv, ok := el.(*ast.KeyValueExpr)
			key, _ := kv.Key.(*ast.Ident)
			if !ok || key == nil || (key.Name != "Name" && key.Name != "Namespace" && key.Name != "Subsystem") {
				continue
			}
			s, ok := stringLit(kv.Value)
			if !ok {
				t.Errorf("%s: cannot read the metric's %s: make it a string literal or teach this test", fset.Position(kv.Pos()), key.Name)
			}
			parts[key.Name] = s
		}
		name := parts["Name"]
		for _, p := range []string{parts["Subsystem"], parts["Namespace"]} {
			if p != "" {
				name = p + "_" + name
			}
		}
		labels, known := labelled[lit]
		defs = append(defs, metricDef{name: name, typ: optsTypes[sel.Sel.Name], labels: labels, labelsKnown: known, pos: relPos(fset, lit.Pos())})
		return true
	})
	return defs
}

// descMetrics returns the metrics of a prometheus.NewDesc call; stack is
// the path from the file to the call.
func descMetrics(t *testing.T, fset *token.FileSet, call *ast.CallExpr, stack []ast.Node) []metricDef {
	if len(call.Args) < 3 {
		return nil
	}
	if name, ok := stringLit(call.Args[0]); ok {
		labels, known := stringList(call.Args[2])
		return []metricDef{{name: name, labels: labels, labelsKnown: known, pos: relPos(fset, call.Pos())}}
	}
	fail := func() []metricDef {
		t.Errorf("%s: cannot read the name of this prometheus.NewDesc: teach this test", fset.Position(call.Pos()))
		return nil
	}
	// "prefix" + param, in a function literal assigned to a variable.
	bin, ok := call.Args[0].(*ast.BinaryExpr)
	if !ok || bin.Op != token.ADD {
		return fail()
	}
	prefix, ok := stringLit(bin.X)
	param, ok2 := bin.Y.(*ast.Ident)
	if !ok || !ok2 {
		return fail()
	}
	if !strings.HasPrefix(prefix, "ration_") {
		return nil
	}
	var fn *ast.FuncLit
	var assign *ast.AssignStmt
	var decl *ast.FuncDecl
	for i := len(stack) - 1; i >= 0; i-- {
		switch n := stack[i].(type) {
		case *ast.FuncLit:
			if fn == nil {
				fn = n
				if i > 0 {
					assign, _ = stack[i-1].(*ast.AssignStmt)
				}
			}
		case *ast.FuncDecl:
			decl = n
		}
	}
	if fn == nil || assign == nil || decl == nil || len(assign.Lhs) != 1 {
		return fail()
	}
	fnVar, ok := assign.Lhs[0].(*ast.Ident)
	if !ok {
		return fail()
	}
	// The positions of the name and the labels among the literal's
	// parameters; labels may be a variadic parameter.
	nameAt, labelsAt, variadic := -1, -1, false
	labelsParam, _ := call.Args[2].(*ast.Ident)
	i := 0
	for _, field := range fn.Type.Params.List {
		for _, id := range field.Names {
			if id.Name == param.Name {
				nameAt = i
			}
			if labelsParam != nil && id.Name == labelsParam.Name {
				labelsAt = i
				_, variadic = field.Type.(*ast.Ellipsis)
			}
			i++
		}
	}
	if nameAt < 0 {
		return fail()
	}
	var defs []metricDef
	ast.Inspect(decl.Body, func(n ast.Node) bool {
		c, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		if id, ok := c.Fun.(*ast.Ident); !ok || id.Name != fnVar.Name || len(c.Args) <= nameAt {
			return true
		}
		suffix, ok := stringLit(c.Args[nameAt])
		if !ok {
			t.Errorf("%s: cannot read the metric name passed to %s: make it a string literal or teach this test", fset.Position(c.Pos()), fnVar.Name)
			return true
		}
		d := metricDef{name: prefix + suffix, pos: relPos(fset, c.Pos())}
		switch {
		case labelsAt >= 0 && variadic:
			d.labels, d.labelsKnown = []string{}, true
			for _, a := range c.Args[min(labelsAt, len(c.Args)):] {
				s, ok := stringLit(a)
				d.labels, d.labelsKnown = append(d.labels, s), d.labelsKnown && ok
			}
		case labelsAt >= 0 && labelsAt < len(c.Args):
			d.labels, d.labelsKnown = stringList(c.Args[labelsAt])
		case labelsParam == nil:
			d.labels, d.labelsKnown = stringList(call.Args[2])
		}
		defs = append(defs, d)
		return true
	})
	if len(defs) == 0 {
		return fail()
	}
	return defs
}

func relPos(fset *token.FileSet, p token.Pos) string {
	pos := fset.Position(p)
	rel, err := filepath.Rel(repoRoot, pos.Filename)
	if err != nil {
		rel = pos.Filename
	}
	return fmt.Sprintf("%s:%d", filepath.ToSlash(rel), pos.Line)
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// stringList reads []string{"a", "b"} or nil.
func stringList(e ast.Expr) ([]string, bool) {
	if id, ok := e.(*ast.Ident); ok && id.Name == "nil" {
		return []string{}, true
	}
	lit, ok := e.(*ast.CompositeLit)
	if !ok {
		return nil, false
	}
	list := []string{}
	for _, el := range lit.Elts {
		s, ok := stringLit(el)
		if !ok {
			return nil, false
		}
		list = append(list, s)
	}
	return list, true
}

// TestCodeMetricsReader checks the reading of the code on the shapes it
// has to understand, so that a metric in a shape it misreads cannot pass.
func TestCodeMetricsReader(t *testing.T) {
	const src = `package p
func newMetrics() {
	a := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ration_a_total"}, []string{"x", "y"})
	b := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "ration", Subsystem: "s", Name: "b"})
	h := prometheus.HistogramOpts{Name: "ration_h_seconds"}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("ration_agent_"+name, help, labels, nil)
	}
	m.c = d("c_total", "help", "path")
	m.e = d("e", "help")
	f := prometheus.NewDesc("ration_f", "help", []string{"z"}, nil)
	_ = "ration_not_a_definition_total"
}`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filepath.Join(repoRoot, "p.go"), src, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, d := range fileMetrics(t, fset, f) {
		got[d.name] = fmt.Sprintf("%s %q %t", d.typ, d.labels, d.labelsKnown)
	}
	want := map[string]string{
		"ration_a_total":       `counter ["x" "y"] true`,
		"ration_s_b":           `gauge [] true`,
		"ration_h_seconds":     `histogram [] false`,
		"ration_agent_c_total": ` ["path"] true`,
		"ration_agent_e":       ` [] true`,
		"ration_f":             ` ["z"] true`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("metrics read (-want +got):\n%s", diff)
	}
}
