package policy

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ration-dev/ration/region"
)

// TestDerive checks that a derived set's Source is Format's document and
// parses back to the set.
func TestDerive(t *testing.T) {
	base := mustParse(t, agreeDoc)
	rules := slices.Clone(base.Rules())
	c := *rules[0]
	c.Limit = 7
	rules[0] = &c
	s, err := Derive("derived", rules)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(s.Source()), string(Format(rules)); got != want {
		t.Errorf("Source: got\n%s\nwant\n%s", got, want)
	}
	if diff := cmp.Diff(rules, s.Rules(), sameRules); diff != "" {
		t.Errorf("rules (-want +got):\n%s", diff)
	}
	checkRoundTrip(t, s)
	if base.Rule(c.Name).Limit == 7 {
		t.Errorf("Derive modified the rules it was given")
	}
}

// TestStageCases covers what TestStage does not: removals, limits on
// names, the nil sets, and staged copies that survive the YAML agents get.
func TestStageCases(t *testing.T) {
	enforced := mustParse(t, agreeDoc)
	long := strings.Repeat("x", maxNameLen-len(StagedSuffix)+1)
	for _, tc := range []struct {
		name     string
		enforced *Set
		staged   string // a document; "" for a nil staged set
		want     []string
		err      string
	}{
		{"a removal stays enforced", enforced, "rules:\n  - {name: per-tenant, key: [tenant], limit: 1000, period: 1s, burst: 2000}\n",
			[]string{"per-tenant", "per-minute", "daily", "per-ip"}, ""},
		{"a changed field other than the quota", enforced, "rules:\n  - {name: per-ip, key: [ip], limit: 20, scope: region, on_error: open}\n",
			[]string{"per-tenant", "per-minute", "daily", "per-ip", "per-ip.staged"}, ""},
		{"nothing staged", enforced, "", []string{"per-tenant", "per-minute", "daily", "per-ip"}, ""},
		{"into an empty policy", nil, "rules:\n  - {name: a, key: [t], limit: 1}\n", []string{"a.staged"}, ""},
		{"a name at the limit", enforced, "rules:\n  - {name: " + long[1:] + ", key: [t], limit: 1}\n",
			[]string{"per-tenant", "per-minute", "daily", "per-ip", long[1:] + StagedSuffix}, ""},
		{"a name too long", enforced, "rules:\n  - {name: " + long + ", key: [t], limit: 1}\n", nil, "longer than 64 bytes"},
		{"a name taken", mustParse(t, "rules:\n  - {name: a.staged, key: [t], limit: 1, shadow: true}\n"),
			"rules:\n  - {name: a, key: [t], limit: 1}\n", nil, `has a rule named "a.staged"`},
	} {
		var staged *Set
		if tc.staged != "" {
			staged = mustParse(t, tc.staged)
		}
		s, err := Stage(tc.enforced, staged)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: got error %v, want one saying %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := names(s.Rules()); !slices.Equal(got, tc.want) {
			t.Errorf("%s: got rules %v, want %v", tc.name, got, tc.want)
		}
		if len(tc.want) == len(tc.enforced.Rules()) && s != tc.enforced {
			t.Errorf("%s: got a new set, want enforced itself", tc.name)
		}
		// What an agent parses from the YAML it is sent keeps the copies
		// staged, each with its own store keys.
		again, err := Parse("agent.yaml", s.Source())
		if err != nil || again.Version() != s.Version() {
			t.Fatalf("%s: re-parsing Source: got %v, version %s; want version %s", tc.name, err, again.Version(), s.Version())
		}
		for _, r := range again.Rules() {
			name, copied := strings.CutSuffix(r.Name, StagedSuffix)
			if r.IsStaged() != copied || copied && !r.Shadow {
				t.Errorf("%s: %s: IsStaged %v, Shadow %v", tc.name, r.Name, r.IsStaged(), r.Shadow)
			}
			if copied && StoreKey(r.Name, "t=1") == StoreKey(name, "t=1") {
				t.Errorf("%s: %s shares its store keys with %s", tc.name, r.Name, name)
			}
		}
	}
}

// TestStricterCases covers what TestStricter does not: the rules left
// alone keep their pointers, changed lists rules in the set's order, and
// the result is a valid set whose Source is its YAML.
func TestStricterCases(t *testing.T) {
	s := mustParse(t, agreeDoc)
	def := func(name string, limit int64, period time.Duration, burst, cost int64) region.RuleDef {
		return region.RuleDef{Name: name, Limit: limit, Period: period, Burst: burst, Cost: cost}
	}
	for _, tc := range []struct {
		name    string
		theirs  map[string][]region.RuleDef
		changed []string
	}{
		{"nothing given", nil, nil},
		{"equal definitions", map[string][]region.RuleDef{"per-tenant": {s.Rule("per-tenant").Def()}, "daily": {s.Rule("daily").Def()}}, nil},
		{"two rules, in the set's order", map[string][]region.RuleDef{
			"daily":      {def("daily", 100, 24*time.Hour, 100, 1)},
			"per-tenant": {def("per-tenant", 10, time.Second, 10, 1)},
		}, []string{"per-tenant", "daily"}},
		{"a minute's limit per second, rounded down", map[string][]region.RuleDef{
			"per-tenant": {def("per-tenant", 59_999, time.Minute, 2000, 1)},
		}, []string{"per-tenant"}},
	} {
		got, changed, err := s.Stricter(tc.theirs)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !slices.Equal(changed, tc.changed) {
			t.Errorf("%s: changed %v, want %v", tc.name, changed, tc.changed)
		}
		if len(tc.changed) == 0 {
			if got != s {
				t.Errorf("%s: got a new set, want s itself", tc.name)
			}
			continue
		}
		checkRoundTrip(t, got)
		if string(got.Source()) != string(Format(got.Rules())) {
			t.Errorf("%s: Source is not the set's YAML", tc.name)
		}
		for _, r := range got.Rules() {
			checkValid(t, r)
			old := s.Rule(r.Name)
			if r.Limit > old.Limit || r.Period != old.Period || r.Algorithm != old.Algorithm || r.Calendar != old.Calendar {
				t.Errorf("%s: %s went from limit %d per %s to %d per %s", tc.name, r.Name, old.Limit, old.Period, r.Limit, r.Period)
			}
		}
		if r := got.Rule("per-tenant"); tc.name == "a minute's limit per second, rounded down" && r.Limit != 999 {
			t.Errorf("%s: limit %d, want 999", tc.name, r.Limit)
		}
	}
}
