package terraform

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// binaries maps the name of a container to the main.go of the command it
// runs, whose flag set its args are checked against.
var binaries = map[string]string{
	"regiond":      "cmd/regiond/main.go",
	"ration-agent": "cmd/agent/main.go",
}

// TestFlags checks every flag passed in a container's args against the flag
// set of the command the container runs, read from its main.go, and that the
// module passes regiond every flag its variables stand for.
func TestFlags(t *testing.T) {
	want := map[string][]string{
		moduleDir: {"admin", "admin-token-file", "decide-after", "grace", "insecure", "listen", "lease-ttl", "log-level", "nats", "nats-ca", "nats-cert", "nats-creds", "nats-key", "nats-nkey",
			"policy", "redis", "redis-ca", "redis-cert", "redis-key", "region", "regions", "store-timeout", "sync-period", "tls-cert", "tls-client-ca", "tls-key"},
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
