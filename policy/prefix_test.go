package policy

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestMatchPrefix: match_prefix requires a value of the prefix; an except
// value ending in "*" excludes a prefix.
func TestMatchPrefix(t *testing.T) {
	s := mustParse(t, `
rules:
  - {name: api, match_prefix: {path: /api/}, key: [path], limit: 1, except: {path: [/api/health, "/api/internal/*"]}}
  - {name: any, key: [path], limit: 1, except: {path: ["/api/*"]}}
`)
	for _, tt := range []struct {
		path string
		want []string
	}{
		{"/api/users", []string{"api"}},
		{"/api/", []string{"api"}},
		{"/api/health", []string{}},
		{"/api/internal/x", []string{}},
		{"/api", []string{"any"}},
		{"/web", []string{"any"}},
	} {
		if got := names(s.Match(nil, []Descriptor{{"path", tt.path}})); !cmp.Equal(got, tt.want) {
			t.Errorf("%s: got %v, want %v", tt.path, got, tt.want)
		}
	}
	if got := s.Match(nil, []Descriptor{{"other", "/api/x"}}); len(got) != 0 {
		t.Errorf("without path: got %v, want nothing", names(got))
	}
	checkRoundTrip(t, s)
	for _, tt := range []struct{ doc, want string }{
		{"rules:\n  - {name: a, key: [k], limit: 1, match_prefix: {k: \"\"}}\n", "x.yaml:2: rules[0].match_prefix.k: must not be empty"},
		{"rules:\n  - {name: a, key: [k], limit: 1, match_prefix: [k]}\n", "x.yaml:2: rules[0].match_prefix: must be a mapping"},
		{"rules:\n  - {name: a, key: [k], limit: 1, match_prefix: {k: 1}}\n", "x.yaml:2: rules[0].match_prefix.k: must be a string"},
	} {
		if _, err := Parse("x.yaml", []byte(tt.doc)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: got %v, want %q", tt.doc, err, tt.want)
		}
	}
}

// TestMatchAgainstNaiveWithEnvoyFields is TestMatchAgainstNaive over rules
// that also have match_prefix, except (values and prefixes) and replaces.
func TestMatchAgainstNaiveWithEnvoyFields(t *testing.T) {
	rng := newRand(t)
	for _, n := range []int{1, 7, 65, 300} {
		var b strings.Builder
		b.WriteString("rules:\n")
		for i := range n {
			fmt.Fprintf(&b, "  - name: r%d\n    limit: 10\n", i)
			keys := rng.Perm(len(randKeys))
			fmt.Fprintf(&b, "    key: [%s]\n", randKeys[keys[0]])
			if rng.IntN(3) == 0 {
				fmt.Fprintf(&b, "    match_prefix: {%s: %q}\n", randKeys[keys[1]], randValues[rng.IntN(len(randValues))][:1])
			}
			if rng.IntN(2) == 0 {
				v := randValues[rng.IntN(len(randValues))]
				if rng.IntN(2) == 0 {
					v = v[:1] + "*"
				}
				fmt.Fprintf(&b, "    except: {%s: [%q]}\n", randKeys[keys[rng.IntN(3)]], v)
			}
			if j := rng.IntN(n); rng.IntN(3) == 0 && j != i {
				fmt.Fprintf(&b, "    replaces: [r%d]\n", j)
			}
		}
		s := mustParse(t, b.String())
		for range 300 {
			ds := randomRequest(rng)
			if diff := cmp.Diff(names(naiveMatch(s, ds)), names(s.Match(nil, ds))); diff != "" {
				t.Fatalf("%d rules, request %v: Match differs from naive (-naive +got):\n%s\n%s", n, ds, diff, b.String())
			}
		}
	}
}
