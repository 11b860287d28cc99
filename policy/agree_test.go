package policy

import (
	"slices"
	"testing"
	"time"

	"github.com/ration-dev/ration/region"
)

const agreeDoc = `rules:
  - {name: per-tenant, key: [tenant], limit: 1000, period: 1s, burst: 2000}
  - {name: per-minute, key: [tenant], limit: 600, period: 1m, burst: 100, cost: 2}
  - {name: daily, key: [tenant], algorithm: fixed_window, limit: 10000, period: day, time_zone: Europe/Paris}
  - {name: per-ip, key: [ip], limit: 20, scope: region}
`

// smallDoc adds rules small enough that a peer's cost reaches their limit.
const smallDoc = `  - {name: small-window, key: [user], algorithm: fixed_window, limit: 10, period: 1m}
  - {name: small, key: [user], limit: 10}
`

func TestStricter(t *testing.T) {
	s, err := Parse("agree.yaml", []byte(agreeDoc+smallDoc))
	if err != nil {
		t.Fatal(err)
	}
	def := func(limit int64, period time.Duration, burst, cost int64) region.RuleDef {
		return region.RuleDef{Name: "x", Limit: limit, Period: period, Burst: burst, Cost: cost}
	}
	type want struct{ limit, burst, cost int64 }
	for _, tc := range []struct {
		name   string
		theirs map[string][]region.RuleDef
		rule   string
		want   want
		same   bool
	}{
		{"a higher peer limit leaves ours", map[string][]region.RuleDef{"per-tenant": {def(5000, time.Second, 10000, 1)}}, "per-tenant", want{1000, 2000, 1}, true},
		{"a lower limit lowers", map[string][]region.RuleDef{"per-tenant": {def(500, time.Second, 2000, 1)}}, "per-tenant", want{500, 2000, 1}, false},
		{"a lower limit of another period, scaled", map[string][]region.RuleDef{"per-tenant": {def(30_000, time.Minute, 2000, 1)}}, "per-tenant", want{500, 2000, 1}, false},
		{"burst and cost", map[string][]region.RuleDef{"per-minute": {def(600, time.Minute, 50, 5)}}, "per-minute", want{600, 50, 5}, false},
		{"several peers folded", map[string][]region.RuleDef{"per-tenant": {def(800, time.Second, 3000, 1), def(900, time.Second, 1500, 1)}}, "per-tenant", want{800, 1500, 1}, false},
		{"a fixed window keeps burst = limit", map[string][]region.RuleDef{"daily": {def(5000, 24*time.Hour, 5000, 1)}}, "daily", want{5000, 5000, 1}, false},
		{"a region rule is not compared", map[string][]region.RuleDef{"per-ip": {def(1, time.Second, 1, 1)}}, "per-ip", want{20, 20, 1}, true},
		{"unknown names are ignored", map[string][]region.RuleDef{"nope": {def(1, time.Second, 1, 1)}}, "per-tenant", want{1000, 2000, 1}, true},
		{"a peer's large cost never makes a window looser", map[string][]region.RuleDef{"small-window": {def(100, time.Minute, 100, 20)}}, "small-window", want{10, 10, 10}, false},
		{"a peer's large cost never makes a bucket looser", map[string][]region.RuleDef{"small": {def(1000, time.Second, 1000, 500)}}, "small", want{10, 10, 10}, false},
		{"an equal limit of a long period stays", map[string][]region.RuleDef{"per-tenant": {def(1000*(1<<20), (1<<20)*time.Second, 2000, 1)}}, "per-tenant", want{1000, 2000, 1}, true},
		{"a tiny limit stays valid", map[string][]region.RuleDef{"per-minute": {def(1, time.Hour, 1, 1)}}, "per-minute", want{1, 2, 2}, false},
	} {
		got, changed, err := s.Stricter(tc.theirs)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if tc.same != (got == s) || tc.same != (len(changed) == 0) {
			t.Errorf("%s: same set %v, changed %v; want same %v", tc.name, got == s, changed, tc.same)
		}
		r := got.Rule(tc.rule)
		if g := (want{r.Limit, r.Burst, r.Cost}); g != tc.want {
			t.Errorf("%s: %s is limit %d, burst %d, cost %d; want %+v", tc.name, tc.rule, r.Limit, r.Burst, r.Cost, tc.want)
		}
		if _, err := Parse("again.yaml", got.Source()); err != nil {
			t.Errorf("%s: the result's source does not parse: %v", tc.name, err)
		}
		if !tc.same && got.Rule(tc.rule).Fingerprint() == s.Rule(tc.rule).Fingerprint() {
			t.Errorf("%s: changed rule keeps its fingerprint", tc.name)
		}
	}
}

func TestStage(t *testing.T) {
	enforced, err := Parse("enforced.yaml", []byte(agreeDoc))
	if err != nil {
		t.Fatal(err)
	}
	staged, err := Parse("staged.yaml", []byte(`rules:
  - {name: per-tenant, key: [tenant], limit: 500, period: 1s, burst: 2000}
  - {name: per-minute, key: [tenant], limit: 600, period: 1m, burst: 100, cost: 2}
  - {name: new-rule, key: [user], limit: 5}
`))
	if err != nil {
		t.Fatal(err)
	}
	s, err := Stage(enforced, staged)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range s.Rules() {
		names = append(names, r.Name)
	}
	want := []string{"per-tenant", "per-minute", "daily", "per-ip", "per-tenant.staged", "new-rule.staged"}
	if !slices.Equal(names, want) {
		t.Fatalf("staged policy's rules %v, want %v", names, want)
	}
	if r := s.Rule("per-tenant.staged"); !r.IsStaged() || r.Limit != 500 {
		t.Errorf("per-tenant.staged: staged %v, limit %d; want a staged shadow copy of limit 500", r.IsStaged(), r.Limit)
	}
	if s.Rule("per-tenant").IsStaged() || s.Rule("per-tenant").Limit != 1000 {
		t.Errorf("the enforced per-tenant changed: %+v", s.Rule("per-tenant"))
	}
	if same, _ := Stage(enforced, enforced); same != enforced {
		t.Errorf("staging the enforced policy itself derived a new set")
	}
}
