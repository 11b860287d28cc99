package kvstore

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ration-dev/ration/policy"
)

func mustParse(t *testing.T, src string) *policy.Set {
	t.Helper()
	s, err := policy.Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestRuleChanges(t *testing.T) {
	a := mustParse(t, `
rules:
  - {name: kept, key: [tenant], limit: 10}
  - {name: changed, key: [tenant], match: {route: /a}, limit: 10, period: 1s}
  - {name: gone, key: [ip], limit: 1}
  - {name: window, key: [tenant], limit: 5, algorithm: fixed_window, period: day}
`)
	b := mustParse(t, `
rules:
  - {name: added, key: [ip], limit: 3}
  - {name: changed, key: [tenant, plan], match: {route: /b}, limit: 20, period: 2s, scope: region, shadow: true}
  - {name: kept, key: [tenant], limit: 10}
  - {name: window, key: [tenant], limit: 5, algorithm: fixed_window, period: week, time_zone: Europe/Paris}
`)
	got := RuleChanges(a, b)
	want := []RuleChange{
		{Rule: "added", Kind: RuleAdded},
		{Rule: "changed", Kind: RuleChanged, Fields: []FieldChange{
			{"match", `{route: "/a"}`, `{route: "/b"}`},
			{"key", "[tenant]", "[tenant, plan]"},
			{"limit", "10", "20"},
			{"period", "1s", "2s"},
			{"burst", "10", "20"},
			{"scope", "global", "region"},
			{"shadow", "false", "true"},
		}},
		{Rule: "window", Kind: RuleChanged, Fields: []FieldChange{
			{"period", "day", "week"},
			{"time_zone", "UTC", "Europe/Paris"},
		}},
		{Rule: "gone", Kind: RuleRemoved},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("RuleChanges (-want +got):\n%s", d)
	}
	var lines []string
	for _, c := range got[:2] {
		lines = append(lines, c.String())
	}
	wantLines := []string{
		"+ added",
		`~ changed: match {route: "/a"} -> {route: "/b"}, key [tenant] -> [tenant, plan], limit 10 -> 20, period 1s -> 2s, burst 10 -> 20, scope global -> region, shadow false -> true`,
	}
	if d := cmp.Diff(wantLines, lines); d != "" {
		t.Errorf("String (-want +got):\n%s", d)
	}
	if got := RuleChanges(nil, a); len(got) != 4 || got[0].Kind != RuleAdded {
		t.Errorf("from nothing: %v", got)
	}
	if got := RuleChanges(a, a); len(got) != 0 {
		t.Errorf("no change: %v", got)
	}
	if got := (RuleChange{Rule: "gone", Kind: RuleRemoved}).String(); got != "- gone" {
		t.Errorf("removed: %q", got)
	}
}
