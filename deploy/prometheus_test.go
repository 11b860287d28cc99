package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// promtool returns the path of promtool. Without it the test skips (Debian's
// package prometheus ships it; scripts/test-deps installs it), but under
// CI=true it fails: CI must check the rules.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool is not installed, and CI=true needs it: run scripts/test-deps (Debian package prometheus)")
		}
		t.Skip("promtool is not installed: run scripts/test-deps (Debian package prometheus) to check the rules")
	}
	return p
}

func runPromtool(t *testing.T, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, promtool(t), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// TestAlertRulesCheck runs promtool check rules on the alerts.
func TestAlertRulesCheck(t *testing.T) {
	runPromtool(t, "check", "rules", "prometheus/alerts.yaml")
}

// TestAlertRulesUnitTests runs the alerts' unit tests
// (prometheus/alerts_test.yaml) with promtool test rules.
func TestAlertRulesUnitTests(t *testing.T) {
	runPromtool(t, "test", "rules", "prometheus/alerts_test.yaml")
}

// ruleFile is the part of a Prometheus rule file this test reads.
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// TestAlertRulesShape checks what promtool does not: every alert waits
// (for:), has a severity an operator routes on, and tells what happened and
// what to do; and the alerts the issue asks for are there.
func TestAlertRulesShape(t *testing.T) {
	b, err := os.ReadFile("prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("prometheus/alerts.yaml: %v", err)
	}
	seen := map[string]bool{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			seen[r.Alert] = true
			if d, err := time.ParseDuration(r.For); err != nil || d <= 0 {
				t.Errorf("%s: got for: %q, want a positive duration", r.Alert, r.For)
			}
			if s := r.Labels["severity"]; s != "page" && s != "ticket" {
				t.Errorf("%s: got severity %q, want page or ticket", r.Alert, s)
			}
			for _, a := range []string{"summary", "description", "runbook"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("%s: no %s annotation", r.Alert, a)
				}
			}
		}
	}
	for _, a := range []string{"RationExchangePeerSilent", "RationAgentRegionUnreachable", "RationAgentFailOpen", "RationAgentFailClosed",
		"RationAgentFallbackActivations", "RationStoreErrors", "RationPolicyRefused", "RationRuleDisagreement", "RationBoundAtRisk"} {
		if !seen[a] {
			t.Errorf("prometheus/alerts.yaml has no alert %s", a)
		}
	}
}

// dashboard is the part of a Grafana dashboard this test reads.
type dashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource *datasource     `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int         `json:"id"`
		Title      string      `json:"title"`
		Type       string      `json:"type"`
		Datasource *datasource `json:"datasource"`
		Targets    []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile("grafana/ration.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("grafana/ration.json: %v", err)
	}
	return d
}

// TestDashboard checks the dashboard's shape: a Prometheus datasource
// variable and a rule variable, and every panel titled, on that datasource,
// with at least one query.
func TestDashboard(t *testing.T) {
	d := readDashboard(t)
	if d.Title == "" || d.UID == "" {
		t.Errorf("got title %q and uid %q, want both", d.Title, d.UID)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		if v.Name == "datasource" && string(v.Query) != `"prometheus"` {
			t.Errorf("datasource variable: got query %s, want \"prometheus\"", v.Query)
		}
		if v.Name == "rule" && (v.Datasource == nil || v.Datasource.UID != "${datasource}") {
			t.Errorf("rule variable: got datasource %+v, want uid ${datasource}", v.Datasource)
		}
	}
	if vars["datasource"] != "datasource" || vars["rule"] != "query" {
		t.Errorf("got variables %v, want datasource (a datasource variable) and rule (a query variable)", vars)
	}
	if len(d.Panels) < 8 {
		t.Errorf("got %d panels, want at least 8", len(d.Panels))
	}
	ids := map[int]bool{}
	for i, p := range d.Panels {
		if strings.TrimSpace(p.Title) == "" {
			t.Errorf("panel %d has no title", i)
		}
		if ids[p.ID] {
			t.Errorf("panel %q: id %d twice", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: got datasource %+v, want prometheus ${datasource}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no target", p.Title)
		}
		for _, q := range p.Targets {
			if strings.TrimSpace(q.Expr) == "" || q.RefID == "" {
				t.Errorf("panel %q: target %q has no expr or refId", p.Title, q.RefID)
			}
		}
	}
}

// TestDashboardQueries parses every query of the dashboard with promtool:
// each becomes a recording rule of a scratch rule file, with Grafana's
// variables replaced by values.
func TestDashboardQueries(t *testing.T) {
	tool := promtool(t)
	d := readDashboard(t)
	vars := strings.NewReplacer("$__rate_interval", "5m", "$rule", ".*", "${rule}", ".*")
	var f strings.Builder
	f.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	n := 0
	for _, p := range d.Panels {
		for _, q := range p.Targets {
			expr := vars.Replace(q.Expr)
			if strings.Contains(expr, "$") {
				t.Errorf("panel %q: query %q uses a variable this test does not know", p.Title, q.Expr)
			}
			n++
			quoted, err := json.Marshal(expr) // a JSON string is a YAML string
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&f, "      - record: dashboard:query%d\n        expr: %s\n", n, quoted)
		}
	}
	path := filepath.Join(t.TempDir(), "dashboard-queries.yaml")
	if err := os.WriteFile(path, []byte(f.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, tool, "check", "rules", path).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules on the dashboard's %d queries: %v\n%s", n, err, out)
	}
}
