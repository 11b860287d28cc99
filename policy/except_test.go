package policy

import (
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestExceptReplaces checks the fields an imported Envoy configuration
// needs: except steps a rule aside for listed values, replaces leaves the
// named rules out of Match, and both round-trip through Format.
func TestExceptReplaces(t *testing.T) {
	s := mustParse(t, `
rules:
  - {name: per-ip, key: [ip], limit: 10, except: {ip: ["10.0.0.1", "10.0.0.2"], route: [/admin]}}
  - {name: vip, match: {ip: "10.0.0.1"}, key: [ip], limit: 100, allow_descriptor_limit: true}
  - {name: tenant, key: [tenant], limit: 5}
  - {name: tenant-vip, match: {tenant: vip}, key: [tenant], limit: 50, replaces: [tenant, per-ip]}
`)
	r := s.Rule("per-ip")
	if want := []Descriptor{{"ip", "10.0.0.1"}, {"ip", "10.0.0.2"}, {"route", "/admin"}}; !cmp.Equal(want, r.Except) {
		t.Errorf("Except: got %v, want %v", r.Except, want)
	}
	if !s.Rule("vip").AllowDescriptorLimit {
		t.Error("vip: AllowDescriptorLimit false, want true")
	}
	for _, tt := range []struct {
		ds   []Descriptor
		want []string
	}{
		{[]Descriptor{{"ip", "10.0.0.9"}}, []string{"per-ip"}},
		{[]Descriptor{{"ip", "10.0.0.1"}}, []string{"vip"}},
		{[]Descriptor{{"ip", "10.0.0.2"}}, []string{}},
		{[]Descriptor{{"ip", "10.0.0.9"}, {"route", "/admin"}}, []string{}},
		{[]Descriptor{{"ip", "10.0.0.9"}, {"tenant", "acme"}}, []string{"per-ip", "tenant"}},
		// tenant-vip replaces tenant and per-ip.
		{[]Descriptor{{"ip", "10.0.0.9"}, {"tenant", "vip"}}, []string{"tenant-vip"}},
		{[]Descriptor{{"ip", "10.0.0.1"}, {"tenant", "vip"}}, []string{"vip", "tenant-vip"}},
	} {
		got := names(s.Match(nil, tt.ds))
		if d := cmp.Diff(tt.want, got); d != "" {
			t.Errorf("Match(%v) (-want +got):\n%s", tt.ds, d)
		}
	}
	checkRoundTrip(t, s)
	plain := mustParse(t, "rules:\n  - {name: per-ip, key: [ip], limit: 10}\n")
	withFalse := mustParse(t, "rules:\n  - {name: per-ip, key: [ip], limit: 10, allow_descriptor_limit: false}\n")
	if plain.Version() != withFalse.Version() {
		t.Errorf("allow_descriptor_limit: false changed the Version: %s, want %s", withFalse.Version(), plain.Version())
	}
}

// TestMatchReplacedKeepsReplacing: a rule that is itself replaced still
// replaces others, as in Envoy's rate limit service, and a match of more
// than 64 rules drops the replaced ones too.
func TestMatchReplacedKeepsReplacing(t *testing.T) {
	var b strings.Builder
	b.WriteString("rules:\n  - {name: a, key: [k], limit: 1, replaces: [b]}\n  - {name: b, key: [k], limit: 1, replaces: [c]}\n  - {name: c, key: [k], limit: 1}\n")
	s := mustParse(t, b.String())
	if got := names(s.Match(nil, []Descriptor{{"k", "v"}})); !cmp.Equal(got, []string{"a"}) {
		t.Errorf("got %v, want [a]", got)
	}
	for i := range 70 {
		b.WriteString("  - {name: x" + strconv.Itoa(i) + ", key: [k], limit: 1}\n")
	}
	s = mustParse(t, b.String())
	if got := s.Match(nil, []Descriptor{{"k", "v"}}); len(got) != 71 || got[0].Name != "a" {
		t.Errorf("got %d rules starting %v, want 71 starting a", len(got), got[0].Name)
	}
}

func TestExceptReplacesErrors(t *testing.T) {
	for _, tt := range []struct{ doc, want string }{
		{"rules:\n  - {name: a, key: [k], limit: 1, except: {k: v}}\n", "x.yaml:2: rules[0].except.k: must be a non-empty list of values"},
		{"rules:\n  - {name: a, key: [k], limit: 1, except: {k: [\"*\"]}}\n", "x.yaml:2: rules[0].except.k[0]: must be a value"},
		{"rules:\n  - {name: a, key: [k], limit: 1, except: {k: [1]}}\n", "x.yaml:2: rules[0].except.k[0]: must be a string"},
		{"rules:\n  - {name: a, key: [k], limit: 1, replaces: [a]}\n", "x.yaml:2: rules[0].replaces[0]: a rule cannot replace itself"},
		{"rules:\n  - {name: a, key: [k], limit: 1,\n     replaces: [b]}\n", "x.yaml:3: rules[0].replaces[0]: no rule is named \"b\""},
		{"rules:\n  - {name: a, key: [k], limit: 1, allow_descriptor_limit: 1}\n", "x.yaml:2: rules[0].allow_descriptor_limit:"},
	} {
		_, err := Parse("x.yaml", []byte(tt.doc))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: got %v, want %q", tt.doc, err, tt.want)
		}
	}
}
