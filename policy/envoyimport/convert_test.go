package envoyimport

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ration-dev/ration/policy"
)

func readFiles(t *testing.T, names ...string) []File {
	t.Helper()
	var out []File
	for _, n := range names {
		data, err := os.ReadFile(filepath.Join("testdata", n))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, File{Name: n, Data: data})
	}
	return out
}

// TestConvert converts two files (two domains) and checks every rule: the
// domain, the keys in order and the node's values matched; every entry's
// value in the key; the values of sibling nodes excepted from a node for
// the key alone; fixed windows of the unit.
func TestConvert(t *testing.T) {
	res, err := Convert(readFiles(t, "messaging.yaml", "edge.yml"))
	if err != nil {
		t.Fatal(err)
	}
	type rule struct {
		Name   string
		Match  map[string]string
		Key    []string
		Except []policy.Descriptor
		Limit  int64
		Period string
	}
	var got []rule
	for _, r := range res.Set.Rules() {
		m := map[string]string{}
		for _, d := range r.Match {
			m[d.Key] = d.Value
		}
		if !r.FixedWindow() {
			t.Errorf("%s: a token bucket, want a fixed window", r.Name)
		}
		p := r.Period.String()
		if r.Calendar != "" {
			p = string(r.Calendar)
		}
		got = append(got, rule{r.Name, m, r.Key, r.Except, r.Limit, p})
	}
	want := []rule{
		{"messaging.message_type_promo.to_number", map[string]string{"domain": "messaging", "envoy.keys": "message_type,to_number", "message_type": "promo"},
			[]string{"message_type", "to_number"}, nil, 3, "day"},
		{"messaging.to_number", map[string]string{"domain": "messaging", "envoy.keys": "to_number"}, []string{"to_number"}, nil, 50, "day"},
		{"edge_per_ip.remote_address", map[string]string{"domain": "edge_per_ip", "envoy.keys": "remote_address"}, []string{"remote_address"},
			[]policy.Descriptor{{Key: "remote_address", Value: "198.51.100.7"}, {Key: "remote_address", Value: "198.51.100.8"}, {Key: "remote_address", Value: "198.51.100.9"}}, 10, "1s"},
		{"edge_per_ip.remote_address_198-51-100-7", map[string]string{"domain": "edge_per_ip", "envoy.keys": "remote_address", "remote_address": "198.51.100.7"},
			[]string{"remote_address"}, nil, 100, "1s"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("rules (-want +got):\n%s", d)
	}
	if len(res.Notes) != 0 {
		t.Errorf("notes %q, want none", res.Notes)
	}
	// The document parses back into the same rules.
	again, err := policy.Parse("again.yaml", res.Set.Source())
	if err != nil || again.Version() != res.Set.Version() {
		t.Errorf("the document parses to version %v (%v), want %s", again.Version(), err, res.Set.Version())
	}
}

// TestConvertErrors: what cannot be converted to the same decisions is an
// error naming the file, line and field.
func TestConvertErrors(t *testing.T) {
	for _, tt := range []struct{ doc, want string }{
		{"descriptors: []\n", "c.yaml:1: domain: is required"},
		{"domain: d\ndescriptors:\n  - value: v\n", "c.yaml:3: descriptors[0].key: is required"},
		{"domain: d\ndescriptors:\n  - key: k\n    value: a*b\n", `c.yaml:4: descriptors[0].value: cannot be converted: wildcard pattern "a*b"`},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: week\n      requests_per_unit: 1\n", "c.yaml:5: descriptors[0].rate_limit.unit: cannot be converted: Envoy's week windows"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n", `c.yaml:5: descriptors[0].rate_limit.unit: must be second, minute, hour or day (got string "fortnight")`},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 0\n", "c.yaml:6: descriptors[0].rate_limit.requests_per_unit: cannot be converted: 0 denies every request"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n", "c.yaml:4: descriptors[0].rate_limit.requests_per_unit: cannot be converted"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      unit_multiplier: 2\n      requests_per_unit: 1\n", "c.yaml:6: descriptors[0].rate_limit.unit_multiplier: unknown field"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n", "c.yaml:4: descriptors[0].rate_limit.unit: must not be set when unlimited is true"},
		{"domain: d\ndescriptors:\n  - key: k\n    quota_mode: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n", "c.yaml:4: descriptors[0].quota_mode: cannot be converted"},
		{"domain: d\ndescriptors:\n  - key: k\n    metadata: {a: b}\n", "c.yaml:4: descriptors[0].metadata: cannot be converted"},
		{"domain: d\ndescriptors:\n  - key: k\n    share_threshold: true\n", "c.yaml:4: descriptors[0].share_threshold: needs a wildcard value ending in *"},
		{"domain: d\ndescriptors:\n  - key: k\n  - key: k\n", `c.yaml:4: descriptors[1]: duplicate descriptor: key "k" with no value`},
		{"domain: d\ndescriptors:\n  - key: k\n    value: \"*\"\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n", `c.yaml:5: descriptors[1]: cannot be converted: no request reaches it: the value "*" (line 3)`},
		{"domain: d\ndescriptors:\n  - key: k\n    value: a*\n  - key: k\n    value: ab*\n    rate_limit: {unit: second, requests_per_unit: 1}\n", `c.yaml:5: descriptors[1]: cannot be converted: no request reaches it: the value "a*" (line 3)`},
		{"domain: d\ndescriptors:\n  - key: k\n    value: a*\n  - key: k\n    value: a*\n", `c.yaml:5: descriptors[1]: duplicate descriptor: key "k" with value "a*"`},
		{"domain: d\ndescriptors:\n  - key: has space\n", `c.yaml:3: descriptors[0].key: cannot be converted: ration descriptor names`},
		{"domain: d\ndescriptors:\n  - key: envoy.keys\n", `c.yaml:3: descriptors[0].key: cannot be converted: the Envoy adapter sets descriptor "envoy.keys" itself`},
		{"domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: k\n        rate_limit: {unit: second, requests_per_unit: 1}\n", `c.yaml:5: descriptors[0].descriptors[0].key: cannot be converted: key "k" repeats`},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces: [{name: nobody}]\n", `c.yaml:7: descriptors[0].rate_limit.replaces[0].name: no rate_limit in domain "d" is named "nobody"`},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      name: me\n      replaces: [{name: me}]\n", `c.yaml:8: descriptors[0].rate_limit.replaces[0].name: a rate limit cannot replace itself`},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      replaces: [{name: x}]\n", `c.yaml:6: descriptors[0].rate_limit.replaces: cannot be converted: an unlimited rate limit`},
		{"domain: d\ndescriptors:\n  - key: k\n    bogus: 1\n", `c.yaml:4: descriptors[0].bogus: unknown field`},
		{"domain: [d]\n", `c.yaml:1: domain: must be a string`},
		{"- a\n", `c.yaml:1: must be a mapping with domain and descriptors`},
		{"domain:\n", `c.yaml:1: domain: must be 1 to 1024 bytes`},
		{"domain: d\ndescriptors:\n  - key:\n", `c.yaml:3: descriptors[0].key: must not be empty`},
		{"", `c.yaml: file is empty`},
		{"domain: d\n---\ndomain: e\n", `c.yaml`},
	} {
		_, err := Convert([]File{{Name: "c.yaml", Data: []byte(tt.doc)}})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q:\ngot  %v\nwant %q", tt.doc, err, tt.want)
			continue
		}
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%q: %v does not wrap ErrInvalid", tt.doc, err)
		}
		var fe *FieldError
		if !errors.As(err, &fe) || fe.File != "c.yaml" {
			t.Errorf("%q: %v holds no FieldError of c.yaml", tt.doc, err)
		}
	}
}

// TestConvertDomains: several files may not share a domain; each file's
// problems name it.
func TestConvertDomains(t *testing.T) {
	a := File{Name: "a.yaml", Data: []byte("domain: d\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]\n")}
	b := File{Name: "b.yaml", Data: []byte("\ndomain: d\n")}
	c := File{Name: "c.yaml", Data: []byte("domain: e\ndescriptors: [{key: k, value: x*y}]\n")}
	_, err := Convert([]File{a, b, c})
	want := "b.yaml:2: domain: duplicate domain \"d\" (first in a.yaml:1)\nc.yaml:2: descriptors[0].value: cannot be converted"
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("got %v, want %q...", err, want)
	}
}

// TestConvertNotes: fields that change only Envoy's metrics are notes, not
// errors, and a node's shadow_mode makes its rule a shadow rule.
func TestConvertNotes(t *testing.T) {
	doc := "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: true\n    detailed_metric: true\n    value_to_metric: true\n    rate_limit: {unit: hour, requests_per_unit: 7}\n"
	res, err := Convert([]File{{Name: "n.yaml", Data: []byte(doc)}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"n.yaml:5: descriptors[0].detailed_metric: changes only Envoy's metric names; ration counts decisions per rule (this node's own rule), not per value",
		"n.yaml:6: descriptors[0].value_to_metric: changes only Envoy's metric names; ration counts decisions per rule (this node's own rule), not per value",
	}
	if d := cmp.Diff(want, res.Notes); d != "" {
		t.Errorf("notes (-want +got):\n%s", d)
	}
	if r := res.Set.Rules()[0]; !r.Shadow || r.Limit != 7 || r.Period.String() != "1h0m0s" {
		t.Errorf("got %+v, want a shadow rule of 7 an hour", r)
	}
}

// TestConvertNames: rule names are valid and unique even for domains and
// values outside the alphabet of names, or too long for one.
func TestConvertNames(t *testing.T) {
	long := strings.Repeat("v", 80)
	doc := "domain: Edge Proxy\ndescriptors:\n" +
		"  - {key: K, value: A, rate_limit: {unit: second, requests_per_unit: 1}}\n" +
		"  - {key: K, value: a, rate_limit: {unit: second, requests_per_unit: 1}}\n" +
		"  - {key: K, value: " + long + ", rate_limit: {unit: second, requests_per_unit: 1}}\n" +
		"  - {key: K, value: " + long + "w, rate_limit: {unit: second, requests_per_unit: 1}}\n"
	res, err := Convert([]File{{Name: "n.yaml", Data: []byte(doc)}})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range res.Set.Rules() {
		if seen[r.Name] || len(r.Name) > 64 {
			t.Errorf("name %q: duplicate or longer than 64", r.Name)
		}
		seen[r.Name] = true
	}
	if n := len(res.Set.Rules()); n != 4 {
		t.Errorf("%d rules, want 4", n)
	}
}

func TestAppendKeys(t *testing.T) {
	var b []byte
	for i, k := range []string{"a", "b,c", "d%e"} {
		b = AppendKeys(b, i, k)
	}
	if got, want := string(b), "a,b%2Cc,d%25e"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestConvertPatterns: a trailing-* value becomes match_prefix, excepting
// the exact values it matches and the earlier patterns that overlap it; the
// key alone excepts every sibling; share_threshold leaves the entry out of
// the key (a key of the keys descriptor when nothing else is left).
func TestConvertPatterns(t *testing.T) {
	doc := `domain: d
descriptors:
  - {key: p, value: a/b/*, rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: p, value: a/*, rate_limit: {unit: second, requests_per_unit: 2}}
  - {key: p, value: a/x, rate_limit: {unit: second, requests_per_unit: 3}}
  - {key: p, value: z, rate_limit: {unit: second, requests_per_unit: 4}}
  - {key: p, rate_limit: {unit: second, requests_per_unit: 5}}
  - {key: f, value: "*", share_threshold: true, rate_limit: {unit: second, requests_per_unit: 6}}
`
	res, err := Convert([]File{{Name: "p.yaml", Data: []byte(doc)}})
	if err != nil {
		t.Fatal(err)
	}
	type rule struct {
		Prefix []policy.Descriptor
		Except []policy.Descriptor
		Key    []string
	}
	got := map[int64]rule{}
	for _, r := range res.Set.Rules() {
		got[r.Limit] = rule{r.MatchPrefix, r.Except, r.Key}
	}
	d := func(k, v string) policy.Descriptor { return policy.Descriptor{Key: k, Value: v} }
	want := map[int64]rule{
		1: {[]policy.Descriptor{d("p", "a/b/")}, nil, []string{"p"}},
		2: {[]policy.Descriptor{d("p", "a/")}, []policy.Descriptor{d("p", "a/b/*"), d("p", "a/x")}, []string{"p"}},
		3: {nil, nil, []string{"p"}},
		4: {nil, nil, []string{"p"}},
		5: {nil, []policy.Descriptor{d("p", "a/*"), d("p", "a/b/*"), d("p", "a/x"), d("p", "z")}, []string{"p"}},
		6: {nil, nil, []string{KeysKey}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rules by limit (-want +got):\n%s", diff)
	}
}
