package policy

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func mustParse(t testing.TB, doc string) *Set {
	t.Helper()
	s, err := Parse("test.yaml", []byte(doc))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return s
}

func names(rules []*Rule) []string {
	out := []string{}
	for _, r := range rules {
		out = append(out, r.Name)
	}
	return out
}

func TestMatch(t *testing.T) {
	s := mustParse(t, `
rules:
  - {name: per-tenant, key: [tenant], limit: 1}
  - {name: transfers, match: {route: /v1/transfers, method: POST}, key: [tenant], limit: 1}
  - {name: any-route-per-ip, match: {route: "*"}, key: [ip], limit: 1}
  - {name: pro-plan, match: {plan: pro}, key: [tenant, plan], limit: 1}
  - {name: per-ip, key: [ip], scope: region, limit: 1}
  - {name: tenant-route, key: [tenant, route], limit: 1}
`)
	tests := []struct {
		name string
		ds   []Descriptor
		want []string
	}{
		{"no descriptors", nil, []string{}},
		{"unknown descriptors only", []Descriptor{{"x", "1"}}, []string{}},
		{"tenant only", []Descriptor{{"tenant", "acme"}}, []string{"per-tenant"}},
		{"transfer", []Descriptor{{"method", "POST"}, {"route", "/v1/transfers"}, {"tenant", "acme"}},
			[]string{"per-tenant", "transfers", "tenant-route"}},
		{"transfer GET", []Descriptor{{"tenant", "acme"}, {"route", "/v1/transfers"}, {"method", "GET"}},
			[]string{"per-tenant", "tenant-route"}},
		{"transfer without the key descriptor", []Descriptor{{"route", "/v1/transfers"}, {"method", "POST"}}, []string{}},
		{"wildcard needs presence", []Descriptor{{"ip", "192.0.2.1"}}, []string{"per-ip"}},
		{"wildcard with route", []Descriptor{{"ip", "192.0.2.1"}, {"route", "/anything"}},
			[]string{"any-route-per-ip", "per-ip"}},
		{"wildcard with empty route", []Descriptor{{"route", ""}, {"ip", "192.0.2.1"}},
			[]string{"any-route-per-ip", "per-ip"}},
		{"duplicate: first free", []Descriptor{{"plan", "free"}, {"tenant", "acme"}, {"plan", "pro"}}, []string{"per-tenant"}},
		{"duplicate: first pro", []Descriptor{{"plan", "pro"}, {"tenant", "acme"}, {"plan", "free"}}, []string{"per-tenant", "pro-plan"}},
		{"duplicate key descriptor", []Descriptor{{"tenant", "a"}, {"tenant", "b"}, {"tenant", "a"}}, []string{"per-tenant"}},
		{"everything, file order", []Descriptor{
			{"ip", "192.0.2.1"}, {"plan", "pro"}, {"route", "/v1/transfers"}, {"method", "POST"}, {"tenant", "acme"},
		}, []string{"per-tenant", "transfers", "any-route-per-ip", "pro-plan", "per-ip", "tenant-route"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := s.Match(nil, tc.ds)
			if diff := cmp.Diff(tc.want, names(got)); diff != "" {
				t.Errorf("Match (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(names(naiveMatch(s, tc.ds)), names(got)); diff != "" {
				t.Errorf("Match against naive (-naive +got):\n%s", diff)
			}
		})
	}
}

func TestMatchAppends(t *testing.T) {
	s := mustParse(t, "rules: [{name: a, key: [t], limit: 1}]")
	prev := &Rule{Name: "prev"}
	got := s.Match([]*Rule{prev}, []Descriptor{{"t", "x"}})
	if diff := cmp.Diff([]string{"prev", "a"}, names(got)); diff != "" {
		t.Errorf("Match onto a non-empty dst (-want +got):\n%s", diff)
	}
}

// naiveMatch is the reference: every rule, in order, checked directly,
// less those another applying rule replaces.
func naiveMatch(s *Set, ds []Descriptor) []*Rule {
	var out []*Rule
	for _, r := range s.Rules() {
		if r.Applies(ds) && (!s.HasReplaces() || len(s.replacers(r, ds)) == 0) {
			out = append(out, r)
		}
	}
	return out
}

// randomSet writes a random but valid document of n rules over a small
// vocabulary, so that rules overlap and requests match many of them.
func randomSet(t testing.TB, rng *rand.Rand, n int) *Set {
	var b strings.Builder
	b.WriteString("rules:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - name: r%d\n    limit: 10\n", i)
		var match []string
		for _, k := range rng.Perm(len(randKeys))[:rng.IntN(3)] {
			v := randValues[rng.IntN(len(randValues))]
			if rng.IntN(4) == 0 {
				v = "*"
			}
			match = append(match, fmt.Sprintf("%s: %q", randKeys[k], v))
		}
		fmt.Fprintf(&b, "    match: {%s}\n", strings.Join(match, ", "))
		var key []string
		for _, k := range rng.Perm(len(randKeys))[:1+rng.IntN(2)] {
			key = append(key, randKeys[k])
		}
		fmt.Fprintf(&b, "    key: [%s]\n", strings.Join(key, ", "))
	}
	return mustParse(t, b.String())
}

var (
	randKeys   = []string{"tenant", "route", "method", "plan", "ip"}
	randValues = []string{"a", "b", "c"}
)

func randomRequest(rng *rand.Rand) []Descriptor {
	var ds []Descriptor
	for range rng.IntN(8) {
		ds = append(ds, Descriptor{randKeys[rng.IntN(len(randKeys))], randValues[rng.IntN(len(randValues))]})
	}
	if rng.IntN(10) == 0 {
		ds = append(ds, Descriptor{"unused", "z"})
	}
	return ds
}

func TestMatchAgainstNaive(t *testing.T) {
	rng := newRand(t)
	for _, n := range []int{1, 7, 64, 65, 300, 513, 2000} {
		s := randomSet(t, rng, n)
		for range 300 {
			ds := randomRequest(rng)
			got := s.Match(nil, ds)
			if diff := cmp.Diff(names(naiveMatch(s, ds)), names(got)); diff != "" {
				t.Fatalf("%d rules, request %v: Match differs from naive (-naive +got):\n%s", n, ds, diff)
			}
		}
	}
}

func TestMatchAllocs(t *testing.T) {
	rng := newRand(t)
	for _, n := range []int{10, 500, MaxRules} {
		s := randomSet(t, rng, n)
		ds := []Descriptor{{"tenant", "a"}, {"route", "b"}, {"method", "c"}, {"plan", "a"}, {"ip", "b"}}
		dst := make([]*Rule, 0, n)
		if allocs := testing.AllocsPerRun(50, func() { dst = s.Match(dst[:0], ds) }); allocs != 0 {
			t.Errorf("%d rules: Match with room in dst: got %v allocs, want 0", n, allocs)
		}
	}
}

func TestNilSet(t *testing.T) {
	var s *Set
	if got := s.Match(nil, []Descriptor{{"tenant", "a"}}); len(got) != 0 {
		t.Errorf("nil Set Match: got %d rules, want 0", len(got))
	}
	if s.Rules() != nil || s.Rule("a") != nil || s.Version() != "" || s.Source() != nil {
		t.Errorf("nil Set accessors: got non-zero results, want nil, nil, \"\", nil")
	}
}

func TestSetAccessors(t *testing.T) {
	doc := "rules:\n  - {name: a, key: [t], limit: 1}\n  - {name: b, key: [t], limit: 2}\n"
	data := []byte(doc)
	s := mustParse(t, doc)
	s2, err := Parse("x", data)
	if err != nil {
		t.Fatal(err)
	}
	data[0] = 'X' // the set keeps its own copy
	if got := string(s2.Source()); got != doc {
		t.Errorf("Source: got %q, want %q", got, doc)
	}
	if r := s.Rule("b"); r == nil || r.Limit != 2 {
		t.Errorf("Rule(b): got %+v, want the rule with limit 2", r)
	}
	if r := s.Rule("c"); r != nil {
		t.Errorf("Rule(c): got %+v, want nil", r)
	}
	if got := len(s.Version()); got != 16 {
		t.Errorf("len(Version()): got %d, want 16", got)
	}
	rules := s.Rules()
	_ = append(rules, &Rule{Name: "appended"})
	if diff := cmp.Diff([]string{"a", "b"}, names(s.Rules())); diff != "" {
		t.Errorf("Rules after a caller's append (-want +got):\n%s", diff)
	}
}

// TestVersionStable pins the Version of token-bucket rules: fields added
// since (the fixed window's) must not change it, or every agent would see
// a new policy on upgrade. The values are those before fixed windows.
func TestVersionStable(t *testing.T) {
	for doc, want := range map[string]string{
		"rules: [{name: a, match: {route: /x}, key: [tenant], limit: 10, period: 1m, burst: 20, cost: 2, scope: region, on_error: open, shadow: true, start_empty: true}]": "a60f92dc982d4a36",
		"rules: [{name: b, key: [ip], limit: 5, partition_reclaim_after: 30s}]":                                                                                            "27becab898da55c4",
	} {
		if got := mustParse(t, doc).Version(); got != want {
			t.Errorf("%s: Version got %s, want %s", doc, got, want)
		}
	}
}

func TestVersion(t *testing.T) {
	base := "rules:\n  - name: a\n    match: {route: /x, method: POST}\n    key: [tenant]\n    limit: 10\n"
	want := mustParse(t, base).Version()

	same := map[string]string{
		"comments and layout": "# policy\nrules:\n\n  - {name: a,   match: {method: POST, route: /x}, key: [tenant], limit: 10}  # one line\n",
		"explicit defaults":   base + "    algorithm: token_bucket\n    period: 1s\n    burst: 10\n    cost: 1\n    scope: global\n    on_error: local\n    shadow: false\n    start_empty: false\n    partition_reclaim_after: 0s\n",
		"other spellings":     "rules:\n  - name: \"a\"\n    match: {route: '/x', method: POST}\n    key: [tenant]\n    limit: 0xA\n    period: 1000ms\n",
	}
	for name, doc := range same {
		if got := mustParse(t, doc).Version(); got != want {
			t.Errorf("%s: Version got %s, want %s (same meaning)", name, got, want)
		}
	}

	different := map[string]string{
		"name":         strings.Replace(base, "name: a", "name: b", 1),
		"match value":  strings.Replace(base, "/x", "/y", 1),
		"wildcard":     strings.Replace(base, "/x", `"*"`, 1),
		"key":          strings.Replace(base, "[tenant]", "[tenant, ip]", 1),
		"limit":        strings.Replace(base, "limit: 10", "limit: 11", 1),
		"period":       base + "    period: 2s\n",
		"burst":        base + "    burst: 11\n",
		"cost":         base + "    cost: 2\n",
		"scope":        base + "    scope: region\n",
		"on_error":     base + "    on_error: open\n",
		"shadow":       base + "    shadow: true\n",
		"start_empty":  base + "    start_empty: true\n",
		"reclaim":      base + "    partition_reclaim_after: 5s\n",
		"second rule":  base + "  - {name: b, key: [t], limit: 1}\n",
		"fixed window": base + "    algorithm: fixed_window\n",
		"time zone":    base + "    algorithm: fixed_window\n    time_zone: Europe/Berlin\n",
		"day":          base + "    algorithm: fixed_window\n    period: day\n",
		"week":         base + "    algorithm: fixed_window\n    period: week\n",
		"month":        base + "    algorithm: fixed_window\n    period: month\n",
		"empty":        "rules: []\n",
	}
	seen := map[string]string{want: "base"}
	for name, doc := range different {
		got := mustParse(t, doc).Version()
		if prev, ok := seen[got]; ok {
			t.Errorf("%s: Version got %s, the same as %s; want a different one", name, got, prev)
		}
		seen[got] = name
	}

	// A fixed window of 24h is a calendar day; UTC is the default zone.
	day := mustParse(t, base+"    algorithm: fixed_window\n    period: day\n").Version()
	for _, doc := range []string{
		base + "    algorithm: fixed_window\n    period: 24h\n",
		base + "    algorithm: fixed_window\n    period: day\n    time_zone: UTC\n",
	} {
		if got := mustParse(t, doc).Version(); got != day {
			t.Errorf("%q: Version got %s, want %s (the UTC day)", doc, got, day)
		}
	}

	// Rule order is meaning: Match returns rules in file order.
	ab := mustParse(t, "rules: [{name: a, key: [t], limit: 1}, {name: b, key: [t], limit: 1}]").Version()
	ba := mustParse(t, "rules: [{name: b, key: [t], limit: 1}, {name: a, key: [t], limit: 1}]").Version()
	if ab == ba {
		t.Errorf("Version of reordered rules: got %s for both orders, want different", ab)
	}
}
