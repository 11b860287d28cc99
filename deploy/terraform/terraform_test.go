package terraform

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/ration-dev/ration/policy"
)

// terraform init, validate and plan need the kubernetes provider, which this
// test cannot download; it checks what can be checked from the files alone.

const (
	moduleDir  = "modules/regiond"
	exampleDir = "examples/three-regions"
	repoRoot   = "../.."
)

// binaries maps the name of a container to the main.go of the command it
// runs, whose flag set its args are checked against.
var binaries = map[string]string{
	"regiond":      "cmd/regiond/main.go",
	"ration-agent": "cmd/agent/main.go",
}

// TestParse parses every Terraform file and template under deploy/terraform.
func TestParse(t *testing.T) {
	p := hclparse.NewParser()
	var tf, templates int
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == ".terraform" {
			return filepath.SkipDir
		}
		switch {
		case strings.HasSuffix(path, ".tf"), strings.HasSuffix(path, ".tfvars"):
			if _, diags := p.ParseHCLFile(path); diags.HasErrors() {
				t.Errorf("%s: %v", path, diags)
			}
			tf++
		case strings.HasSuffix(path, ".tftpl"):
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if _, diags := hclsyntax.ParseTemplate(src, path, hcl.InitialPos); diags.HasErrors() {
				t.Errorf("%s: %v", path, diags)
			}
			templates++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The module has four files, the example five and a .tfvars.
	if tf < 10 || templates < 1 {
		t.Fatalf("parsed %d Terraform files and %d templates, want at least 10 and 1: did the layout move?", tf, templates)
	}
}

// TestReferences stands in for terraform validate's reference checks: every
// var.X is declared, every local.X defined, every module.M.O names a module
// call and one of its source's outputs, and every module call passes only
// declared variables and all required ones.
func TestReferences(t *testing.T) {
	for _, dir := range []string{moduleDir, exampleDir} {
		t.Run(dir, func(t *testing.T) {
			m := loadModule(t, dir)
			for _, attr := range m.attributes() {
				for _, tr := range attr.Expr.Variables() {
					checkReference(t, m, attr, tr)
				}
			}
			for name, call := range m.modules {
				src, ok := attrString(call.Body, "source")
				if !ok || !strings.HasPrefix(src, "../") {
					continue
				}
				callee := loadModule(t, filepath.Join(dir, src))
				for arg := range call.Body.Attributes {
					if slices.Contains([]string{"source", "providers", "count", "for_each", "depends_on", "version"}, arg) {
						continue
					}
					if _, ok := callee.variables[arg]; !ok {
						t.Errorf("module %q passes %q: got no such variable in %s", name, arg, src)
					}
				}
				for v, block := range callee.variables {
					if _, hasDefault := block.Body.Attributes["default"]; hasDefault {
						continue
					}
					if _, ok := call.Body.Attributes[v]; !ok {
						t.Errorf("module %q does not pass the required variable %q of %s", name, v, src)
					}
				}
			}
		})
	}
}

func checkReference(t *testing.T, m *tfModule, attr *hclsyntax.Attribute, tr hcl.Traversal) {
	t.Helper()
	at := attr.SrcRange.String()
	step := func(i int) string {
		if len(tr) > i {
			if a, ok := tr[i].(hcl.TraverseAttr); ok {
				return a.Name
			}
		}
		return ""
	}
	switch tr.RootName() {
	case "var":
		if _, ok := m.variables[step(1)]; !ok {
			t.Errorf("%s: var.%s: got no such variable", at, step(1))
		}
	case "local":
		if _, ok := m.locals[step(1)]; !ok {
			t.Errorf("%s: local.%s: got no such local", at, step(1))
		}
	case "module":
		call, ok := m.modules[step(1)]
		if !ok {
			t.Errorf("%s: module.%s: got no such module call", at, step(1))
			return
		}
		src, _ := attrString(call.Body, "source")
		if !strings.HasPrefix(src, "../") {
			return
		}
		if callee := loadModule(t, filepath.Join(m.dir, src)); !callee.outputs[step(2)] {
			t.Errorf("%s: module.%s.%s: got no such output in %s", at, step(1), step(2), src)
		}
	}
}

// TestFlags checks every flag passed in a container's args against the flag
// set of the command the container runs, read from its main.go, and that the
// module passes regiond every flag its variables stand for.
func TestFlags(t *testing.T) {
	want := map[string][]string{
		moduleDir: {"admin", "decide-after", "grace", "listen", "lease-ttl", "log-level", "nats",
			"policy", "redis", "region", "regions", "store-timeout", "sync-period"},
		exampleDir: {"admin", "grace", "listen", "regiond"},
	}
	for _, dir := range []string{moduleDir, exampleDir} {
		t.Run(dir, func(t *testing.T) {
			m := loadModule(t, dir)
			var passed []string
			for _, c := range m.blocks("container") {
				name, _ := attrString(c.Body, "name")
				main, ok := binaries[name]
				if !ok {
					continue // envoy
				}
				defined := goFlags(t, filepath.Join(repoRoot, main))
				args, ok := c.Body.Attributes["args"]
				if !ok {
					t.Errorf("container %q has no args", name)
					continue
				}
				seen := map[string]bool{}
				for _, f := range argFlags(m.resolve(args.Expr)) {
					if !defined[f] {
						t.Errorf("container %q passes -%s: got no such flag in %s", name, f, main)
					}
					if seen[f] {
						t.Errorf("container %q passes -%s twice", name, f)
					}
					seen[f] = true
					passed = append(passed, f)
				}
			}
			slices.Sort(passed)
			if diff := cmp.Diff(slices.Sorted(slices.Values(want[dir])), passed); diff != "" {
				t.Errorf("flags passed (-want +got):\n%s", diff)
			}
		})
	}
}

// goFlags returns the names of the flags that a command's main.go defines:
// the name argument of every flag-defining call (fs.StringVar(&x, "name",
// ...), fs.Duration("name", ...), ...). Parsing the source keeps the test
// hermetic; running the command with -h would build it.
func goFlags(t *testing.T, path string) map[string]bool {
	t.Helper()
	nameArg := map[string]int{
		"Bool": 0, "BoolVar": 1, "BoolFunc": 0, "Duration": 0, "DurationVar": 1,
		"Float64": 0, "Float64Var": 1, "Func": 0, "Int": 0, "IntVar": 1, "Int64": 0, "Int64Var": 1,
		"String": 0, "StringVar": 1, "TextVar": 1, "Uint": 0, "UintVar": 1, "Uint64": 0, "Uint64Var": 1, "Var": 1,
	}
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	flags := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		i, ok := nameArg[sel.Sel.Name]
		if _, recv := sel.X.(*ast.Ident); !ok || !recv || len(call.Args) <= i {
			return true
		}
		if lit, ok := call.Args[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
			if name, err := strconv.Unquote(lit.Value); err == nil {
				flags[name] = true
			}
		}
		return true
	})
	// A parse that found nothing would pass every check vacuously.
	if !flags["grace"] || !flags["log-level"] {
		t.Fatalf("%s: found flags %v, want at least grace and log-level", path, flags)
	}
	return flags
}

// flagArg matches an argument that starts with a flag: -name, -name=value
// (or with two dashes, which Go's flag package also accepts).
var flagArg = regexp.MustCompile(`^--?([A-Za-z0-9][A-Za-z0-9._-]*)(=|$)`)

// argFlags returns the flags in an args expression: the leading literal of
// every string in it, wherever it sits (a list, concat(), a conditional).
func argFlags(e hclsyntax.Expression) []string {
	var flags []string
	hclsyntax.VisitAll(e, func(n hclsyntax.Node) hcl.Diagnostics {
		tmpl, ok := n.(*hclsyntax.TemplateExpr)
		if !ok || len(tmpl.Parts) == 0 {
			return nil
		}
		if s, ok := literalString(tmpl.Parts[0]); ok {
			if m := flagArg.FindStringSubmatch(s); m != nil {
				flags = append(flags, m[1])
			}
		}
		return nil
	})
	return flags
}

// TestDurationPattern checks the Go duration pattern of the module's
// validations and the unit table its locals convert durations with: every
// string the pattern accepts is a Go duration, common ones are accepted, and
// the module's milliseconds agree with time.ParseDuration.
func TestDurationPattern(t *testing.T) {
	m := loadModule(t, moduleDir)
	var pattern string
	for _, v := range []string{"sync_period", "decide_after", "lease_ttl", "store_timeout"} {
		block, ok := m.variables[v]
		if !ok {
			t.Fatalf("no variable %q", v)
		}
		var got []string
		for _, val := range block.Body.Blocks {
			if val.Type == "validation" {
				got = append(got, regexArgs(val.Body.Attributes["condition"].Expr, "regex")...)
			}
		}
		if len(got) != 1 || (pattern != "" && got[0] != pattern) {
			t.Fatalf("variable %q validates with regex patterns %q, want the one duration pattern %q", v, got, pattern)
		}
		pattern = got[0]
	}
	re := regexp.MustCompile(pattern)

	var units map[string]float64
	if diags := gohcl.DecodeExpression(m.locals["duration_unit_ms"].Expr, nil, &units); diags.HasErrors() {
		t.Fatal(diags)
	}
	split := regexArgs(m.locals["sync_period_ms"].Expr, "regexall")
	if len(split) != 1 {
		t.Fatalf("local sync_period_ms: got regexall patterns %q, want one", split)
	}
	parts := regexp.MustCompile(split[0])
	millis := func(s string) float64 {
		var ms float64
		for _, p := range parts.FindAllStringSubmatch(s, -1) {
			n, err := strconv.ParseFloat(p[1], 64)
			if err != nil {
				t.Fatalf("%q: the module's tonumber(%q) would fail", s, p[1])
			}
			ms += n * units[p[2]]
		}
		return ms
	}

	for _, s := range []string{"1s", "250ms", "1m30s", "1.5s", "100us", "100µs", "2h45m", "10ns", "0s"} {
		if !re.MatchString(s) {
			t.Errorf("%q: got rejected, want accepted", s)
		}
	}
	for _, s := range []string{"", "1", "s", "1 s", "-1s", "1sec", "1S", "1d", "1s ", "ms1"} {
		if re.MatchString(s) {
			t.Errorf("%q: got accepted, want rejected", s)
		}
	}
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 2))
	alphabet := []string{"0", "1", "2", "5", "9", ".", "ns", "us", "µs", "ms", "s", "m", "h", "-", " ", "d", "x"}
	accepted := 0
	for range 20000 {
		var b strings.Builder
		for range 1 + rng.IntN(8) {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		s := b.String()
		if !re.MatchString(s) {
			continue
		}
		if millis(s) >= float64(math.MaxInt64)/float64(time.Millisecond) {
			continue // too long for a time.Duration: an overflow, not a syntax the pattern gets wrong
		}
		accepted++
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("seed %d: %q: got accepted by the pattern, want rejected (time.ParseDuration: %v)", seed, s, err)
		}
		// Go truncates each component to whole nanoseconds (1e-6 ms).
		if got, want := millis(s), float64(d)/float64(time.Millisecond); math.Abs(got-want) > 1e-5+1e-9*want {
			t.Fatalf("seed %d: %q: got %v ms from the module's unit table, want %v", seed, s, got, want)
		}
	}
	if accepted < 100 {
		t.Fatalf("seed %d: only %d random strings were durations, want at least 100 to mean anything", seed, accepted)
	}
}

// regexArgs returns the literal first argument of every call of fn in e.
func regexArgs(e hclsyntax.Expression, fn string) []string {
	var got []string
	hclsyntax.VisitAll(e, func(n hclsyntax.Node) hcl.Diagnostics {
		if call, ok := n.(*hclsyntax.FunctionCallExpr); ok && call.Name == fn && len(call.Args) > 0 {
			if s, ok := literalString(call.Args[0]); ok {
				got = append(got, s)
			}
		}
		return nil
	})
	return got
}

// TestExamplePolicy parses the example's policy with ration's own parser,
// as regiond will at start.
func TestExamplePolicy(t *testing.T) {
	path := filepath.Join(exampleDir, "policy.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := policy.Parse(path, data); err != nil {
		t.Fatalf("got %v, want a valid policy", err)
	}
}

// TestFmt runs terraform fmt -check, which needs no provider and no network.
func TestFmt(t *testing.T) {
	tf, err := exec.LookPath("terraform")
	if err != nil {
		t.Skip("terraform is not on PATH: formatting not checked")
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, tf, "fmt", "-check", "-recursive", "-diff", ".")
	// An empty CLI configuration and no checkpoint call: nothing to read
	// from the user's setup, nothing to fetch.
	cfg := filepath.Join(t.TempDir(), "terraformrc")
	if err := os.WriteFile(cfg, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(os.Environ(), "TF_CLI_CONFIG_FILE="+cfg, "CHECKPOINT_DISABLE=1", "TF_IN_AUTOMATION=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("terraform fmt -check -recursive: %v\n%s(run terraform fmt -recursive deploy/terraform)", err, out)
	}
}

func testSeed(t *testing.T) uint64 {
	t.Helper()
	seed, err := strconv.ParseUint(os.Getenv("RATION_SEED"), 10, 64)
	if err != nil || seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay: RATION_SEED=%d go test ./deploy/terraform -run '%s')", seed, seed, t.Name())
	return seed
}

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
