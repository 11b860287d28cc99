package terraform

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
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
