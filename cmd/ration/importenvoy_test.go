package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ration-dev/ration/policy"
)

// TestImportEnvoy converts a directory of Envoy ratelimit files (two
// domains; other files ignored) into a policy on stdout, with notes on
// stderr, and refuses what cannot convert with file, line and field.
func TestImportEnvoy(t *testing.T) {
	dir := t.TempDir()
	write := func(name, doc string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	a := write("a.yaml", "domain: a\ndescriptors:\n  - key: user\n    detailed_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	write("b.yml", "domain: b\ndescriptors:\n  - key: ip\n    value: 192.0.2.1\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	write("README.md", "not a configuration\n")

	out, errOut, code := ration(t, "policy", "import-envoy", dir)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	set, err := policy.Parse("out.yaml", []byte(out))
	if err != nil {
		t.Fatalf("stdout is not a policy: %v\n%s", err, out)
	}
	if got := len(set.Rules()); got != 2 || set.Rule("a.user") == nil || set.Rule("b.ip_192-0-2-1") == nil {
		t.Errorf("got rules %v, want a.user and b.ip_192-0-2-1", set.Rules())
	}
	if want := "note: " + a + ":4: descriptors[0].detailed_metric:"; !strings.HasPrefix(errOut, want) {
		t.Errorf("stderr %q, want %q...", errOut, want)
	}

	out, _, code = ration(t, "policy", "import-envoy", a, "-o", "json")
	var j importJSON
	if err := json.Unmarshal([]byte(out), &j); err != nil || code != exitOK || !j.OK || j.Rules != 1 || len(j.Notes) != 1 || !strings.Contains(j.Policy, "a.user") {
		t.Errorf("-o json: exit %d, %+v (%v)", code, j, err)
	}

	bad := write("c.yaml", "domain: c\ndescriptors:\n  - key: path\n    value: /api/*/users\n")
	_, errOut, code = ration(t, "policy", "import-envoy", bad)
	if want := bad + ":4: descriptors[0].value: cannot be converted"; code != exitRefused || !strings.HasPrefix(errOut, want) || !strings.Contains(errOut, "ration: cannot convert: 1 problem(s)") {
		t.Errorf("bad file: exit %d, stderr %q; want %d, %q...", code, errOut, exitRefused, want)
	}
	if _, _, code = ration(t, "policy", "import-envoy", filepath.Join(dir, "missing")); code != exitUsage {
		t.Errorf("missing file: exit %d, want %d", code, exitUsage)
	}
	if _, _, code = ration(t, "policy", "import-envoy", t.TempDir()); code != exitUsage {
		t.Errorf("empty directory: exit %d, want %d", code, exitUsage)
	}
}
