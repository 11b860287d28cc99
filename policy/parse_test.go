package policy

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseDefaults(t *testing.T) {
	doc := `
rules:
  - name: minimal
    key: [tenant]
    limit: 100
`
	s, err := Parse("r.yaml", []byte(doc))
	if err != nil {
		t.Fatalf("Parse: got error %v, want none", err)
	}
	want := []*Rule{{
		Name: "minimal", Key: []string{"tenant"}, Algorithm: AlgorithmTokenBucket, Limit: 100, Period: time.Second, Burst: 100, Cost: 1,
		Scope: ScopeGlobal, OnError: OnErrorLocal, Line: 3,
	}}
	if diff := cmp.Diff(want, s.Rules()); diff != "" {
		t.Errorf("rules (-want +got):\n%s", diff)
	}
}

func TestParseAllFields(t *testing.T) {
	doc := `# every field set
rules:
  - name: transfers-per-tenant
    match:
      route: /v1/transfers
      method: "POST"
      plan: '*'
    key: [tenant, plan]
    limit: 50_000
    period: 1m
    burst: 0x10000
    cost: 10
    scope: global
    on_error: closed
    shadow: true
    partition_reclaim_after: 30s
    start_empty: true
  - {name: per-ip, key: [ip], limit: 20, scope: region, on_error: open, partition_reclaim_after: 0}
`
	s, err := Parse("r.yaml", []byte(doc))
	if err != nil {
		t.Fatalf("Parse: got error %v, want none", err)
	}
	want := []*Rule{{
		Name:  "transfers-per-tenant",
		Match: []Descriptor{{"method", "POST"}, {"plan", "*"}, {"route", "/v1/transfers"}},
		Key:   []string{"tenant", "plan"}, Algorithm: AlgorithmTokenBucket,
		Limit: 50_000, Period: time.Minute, Burst: 0x10000, Cost: 10,
		Scope: ScopeGlobal, OnError: OnErrorClosed, Shadow: true,
		PartitionReclaimAfter: 30 * time.Second, StartEmpty: true, Line: 3,
	}, {
		Name: "per-ip", Key: []string{"ip"}, Algorithm: AlgorithmTokenBucket, Limit: 20, Period: time.Second, Burst: 20, Cost: 1,
		Scope: ScopeRegion, OnError: OnErrorOpen, Line: 18,
	}}
	if diff := cmp.Diff(want, s.Rules()); diff != "" {
		t.Errorf("rules (-want +got):\n%s", diff)
	}
	if got, want := s.Rules()[0].Rate(), 50_000.0/60; got != want {
		t.Errorf("Rate: got %v, want %v", got, want)
	}
}

func TestParseValid(t *testing.T) {
	for _, tc := range []struct{ name, doc string }{
		{"empty rules list", "rules: []\n"},
		{"document start marker", "---\nrules: []\n"},
		{"trailing empty documents", "rules: []\n---\n---\n# done\n"},
		{"document end marker", "rules: []\n...\n"},
		{"max values", "rules: [{name: a, key: [t], limit: 9007199254740992, burst: 9007199254740992, cost: 9007199254740992, period: 744h}]"},
		{"anchor without alias", "rules: [{name: a, key: &k [t], limit: 1}]"},
		{"empty match", "rules: [{name: a, match: {}, key: [t], limit: 1}]"},
		{"descriptor name alphabet", "rules: [{name: a.b_c-9, match: {x-Y_z.1:2/3: v}, key: [generic_key], limit: 1}]"},
		{"64-character name", "rules: [{name: " + strings.Repeat("a", 64) + ", key: [t], limit: 1}]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Parse("r.yaml", []byte(tc.doc)); err != nil {
				t.Errorf("Parse: got error %v, want none", err)
			}
		})
	}
}

// rule wraps fields into a one-rule document whose fields start on line 3.
func rule(fields string) string {
	return "rules:\n  - name: r\n" + fields
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want string // Error(), problems one per line
	}{
		{"empty", "", "r.yaml: document is empty; want a mapping with a rules list (an empty list means no limits)"},
		{"comments only", "# nothing\n", "r.yaml: document is empty; want a mapping with a rules list (an empty list means no limits)"},
		{"not a mapping", "- a\n", "r.yaml:1: document must be a mapping with a rules list (got a list)"},
		{"scalar document", "hello\n", `r.yaml:1: document must be a mapping with a rules list (got string "hello")`},
		{"rules missing", "ruls: []\n",
			"r.yaml:1: ruls: unknown field (known: rules)\n" +
				"r.yaml:1: rules: is required (an empty list means no limits)"},
		{"rules null", "rules:\n", "r.yaml:1: rules: must be a list (got null; use [] for no limits)"},
		{"rules mapping", "rules: {a: 1}\n", "r.yaml:1: rules: must be a list (got a mapping; use [] for no limits)"},
		{"duplicate rules key", "rules: []\nrules: []\n", "r.yaml:2: rules: duplicate key (first at line 1)"},
		{"rule not a mapping", "rules: [a]\n", `r.yaml:1: rules[0]: must be a mapping (got string "a")`},
		// yaml.v3 reports the line where the enclosing construct began, which
		// may be before the line with the problem.
		{"syntax error", "rules:\n  - name: a\n    key: [t\n    limit: 1\n", "r.yaml:2: YAML syntax error: did not find expected ',' or ']'"},
		{"second document", "rules: []\n---\nrules: []\n", "r.yaml:3: only one YAML document is allowed"},
		{"non-string key", "rules: []\n1: x\n", "r.yaml:2: keys must be strings (got integer 1)"},
		{"unprintable key", "rules: []\n\"a\\nb\": x\n", `r.yaml:2: "a\nb": unknown field (known: rules)`},
		{"merge key", "rules: [{<<: {limit: 1}, name: a, key: [t], limit: 1}]\n", "r.yaml:1: rules[0]: merge keys (<<) are not supported"},
		{"alias", "rules:\n  - {name: a, key: [t], limit: &n 5}\n  - {name: b, key: [t], limit: *n}\n",
			"r.yaml:3: rules[1].limit: aliases are not supported\n" +
				"r.yaml:3: rules[1].limit: is required"},
		{"alias in list", "rules:\n  - {name: a, key: [&t t], limit: 5}\n  - {name: b, key: [*t], limit: 5}\n",
			"r.yaml:3: rules[1].key[0]: must be a descriptor name (got an alias; aliases are not supported)"},

		{"unknown rule field", rule("    key: [t]\n    limit: 1\n    limt: 2\n"),
			"r.yaml:5: rules[0].limt: unknown field (known: name, match, key, algorithm, limit, period, time_zone, burst, cost, scope, on_error, shadow, partition_reclaim_after, start_empty, clients, match_prefix, except, replaces, allow_descriptor_limit)"},
		{"duplicate rule field", rule("    key: [t]\n    limit: 1\n    limit: 2\n"),
			"r.yaml:5: rules[0].limit: duplicate key (first at line 4)"},
		{"required fields", "rules:\n  - shadow: true\n",
			"r.yaml:2: rules[0].name: is required\n" +
				"r.yaml:2: rules[0].key: is required (the descriptors that form the rate-limited key)\n" +
				"r.yaml:2: rules[0].limit: is required"},

		{"name uppercase", "rules: [{name: Transfers, key: [t], limit: 1}]", `r.yaml:1: rules[0].name: must match [a-z0-9][a-z0-9._-]* (got "Transfers")`},
		{"name leading dash", "rules: [{name: -a, key: [t], limit: 1}]", `r.yaml:1: rules[0].name: must match [a-z0-9][a-z0-9._-]* (got "-a")`},
		{"name empty", "rules: [{name: '', key: [t], limit: 1}]", "r.yaml:1: rules[0].name: must not be empty"},
		{"name too long", "rules: [{name: " + strings.Repeat("a", 65) + ", key: [t], limit: 1}]", "r.yaml:1: rules[0].name: must be at most 64 characters (got 65)"},
		{"name not a string", "rules: [{name: 12, key: [t], limit: 1}]", "r.yaml:1: rules[0].name: must be a string (got integer 12)"},
		{"duplicate names", "rules:\n  - {name: a, key: [t], limit: 1}\n  - {name: b, key: [t], limit: 1}\n  - {name: a, key: [t], limit: 1}\n",
			`r.yaml:4: rules[2].name: duplicate rule name "a" (first at line 2)`},

		{"key empty", rule("    key: []\n    limit: 1\n"), "r.yaml:3: rules[0].key: must not be empty"},
		{"key scalar", rule("    key: tenant\n    limit: 1\n"), `r.yaml:3: rules[0].key: must be a list of descriptor names (got string "tenant")`},
		{"key duplicate", rule("    key:\n      - tenant\n      - route\n      - tenant\n    limit: 1\n"), `r.yaml:6: rules[0].key[2]: duplicate descriptor name "tenant"`},
		{"key bad name", rule("    key: [tenant, 'a=b', '']\n    limit: 1\n"),
			"r.yaml:3: rules[0].key[1]: descriptor name must match [A-Za-z0-9_.:/-]+ (got \"a=b\")\n" +
				"r.yaml:3: rules[0].key[2]: descriptor name must not be empty"},
		{"key item not a string", rule("    key: [1]\n    limit: 1\n"), "r.yaml:3: rules[0].key[0]: must be a descriptor name (got integer 1)"},
		{"key too long", rule("    key: [" + strings.Repeat("x", 129) + "]\n    limit: 1\n"),
			"r.yaml:3: rules[0].key[0]: descriptor name must be at most 128 characters (got 129)"},

		{"match not a mapping", rule("    match: [route]\n    key: [t]\n    limit: 1\n"), "r.yaml:3: rules[0].match: must be a mapping of descriptor names to values (got a list)"},
		{"match values", rule("    match: {a: 1, b: true, c: 1.5, d: ~, e: '', f: [x]}\n    key: [t]\n    limit: 1\n"),
			"r.yaml:3: rules[0].match.a: must be a string (got integer 1); quote it to match the text: \"1\"\n" +
				"r.yaml:3: rules[0].match.b: must be a string (got boolean true); quote it to match the text: \"true\"\n" +
				"r.yaml:3: rules[0].match.c: must be a string (got number 1.5); quote it to match the text: \"1.5\"\n" +
				"r.yaml:3: rules[0].match.d: must be a string (got null)\n" +
				"r.yaml:3: rules[0].match.e: must not be empty (use \"*\" for any value)\n" +
				"r.yaml:3: rules[0].match.f: must be a string (got a list)"},
		{"match bad name", rule("    match: {'a b': x}\n    key: [t]\n    limit: 1\n"), `r.yaml:3: rules[0].match."a b": descriptor name must match [A-Za-z0-9_.:/-]+ (got "a b")`},
		{"match duplicate", rule("    match:\n      route: /a\n      route: /b\n    key: [t]\n    limit: 1\n"), "r.yaml:5: rules[0].match.route: duplicate key (first at line 4)"},
		{"match value too long", rule("    match: {a: " + strings.Repeat("v", 1025) + "}\n    key: [t]\n    limit: 1\n"), "r.yaml:3: rules[0].match.a: must be at most 1024 bytes (got 1025)"},

		{"limit zero", rule("    key: [t]\n    limit: 0\n"), "r.yaml:4: rules[0].limit: must be > 0"},
		{"limit negative", rule("    key: [t]\n    limit: -5\n"), "r.yaml:4: rules[0].limit: must be > 0"},
		{"limit float", rule("    key: [t]\n    limit: 1.5\n"), "r.yaml:4: rules[0].limit: must be an integer (got number 1.5)"},
		{"limit float integral", rule("    key: [t]\n    limit: 1e3\n"), "r.yaml:4: rules[0].limit: must be an integer (got number 1e3)"},
		{"limit string", rule("    key: [t]\n    limit: '100'\n"), `r.yaml:4: rules[0].limit: must be an integer (got string "100")`},
		{"limit null", rule("    key: [t]\n    limit:\n"), "r.yaml:4: rules[0].limit: must be an integer (got null)"},
		{"limit beyond int64", rule("    key: [t]\n    limit: 9223372036854775808\n"), "r.yaml:4: rules[0].limit: must be an integer that fits in int64 (got 9223372036854775808)"},
		{"limit beyond uint64", rule("    key: [t]\n    limit: 99999999999999999999\n"), "r.yaml:4: rules[0].limit: must be an integer that fits in int64 (got 99999999999999999999)"},
		{"limit beyond 2^53", rule("    key: [t]\n    limit: 9007199254740993\n"), "r.yaml:4: rules[0].limit: must be at most 9007199254740992 (2^53)"},

		{"period zero", rule("    key: [t]\n    limit: 1\n    period: 0s\n"), "r.yaml:5: rules[0].period: must be > 0"},
		{"period bare zero", rule("    key: [t]\n    limit: 1\n    period: 0\n"), "r.yaml:5: rules[0].period: must be > 0"},
		{"period negative", rule("    key: [t]\n    limit: 1\n    period: -1s\n"), "r.yaml:5: rules[0].period: must be > 0"},
		{"period too long", rule("    key: [t]\n    limit: 1\n    period: 744h1s\n"), "r.yaml:5: rules[0].period: must be at most 744h (31 days)"},
		{"period without unit", rule("    key: [t]\n    limit: 1\n    period: 1\n"), `r.yaml:5: rules[0].period: must be a Go duration with a unit, such as "1s" or "500ms" (got integer 1)`},
		{"period words", rule("    key: [t]\n    limit: 1\n    period: 1 second\n"), `r.yaml:5: rules[0].period: must be a Go duration such as "1s" or "500ms" (got "1 second")`},
		{"period list", rule("    key: [t]\n    limit: 1\n    period: [1s]\n"), `r.yaml:5: rules[0].period: must be a Go duration such as "1s" or "500ms" (got a list)`},

		{"cost zero", rule("    key: [t]\n    limit: 1\n    cost: 0\n"), "r.yaml:5: rules[0].cost: must be > 0"},
		{"burst below cost", rule("    key: [t]\n    limit: 100\n    burst: 5\n    cost: 10\n"), "r.yaml:5: rules[0].burst: must be >= cost (10)"},
		{"cost above default burst", rule("    key: [t]\n    limit: 5\n    cost: 10\n"), "r.yaml:5: rules[0].cost: must be <= burst, which defaults to limit (5)"},
		{"burst negative", rule("    key: [t]\n    limit: 5\n    burst: -1\n"), "r.yaml:5: rules[0].burst: must be > 0"},

		{"scope", rule("    key: [t]\n    limit: 1\n    scope: Global\n"), `r.yaml:5: rules[0].scope: must be one of "global", "region" (got string "Global")`},
		{"on_error", rule("    key: [t]\n    limit: 1\n    on_error: fail\n"), `r.yaml:5: rules[0].on_error: must be one of "local", "open", "closed" (got string "fail")`},
		{"on_error bool", rule("    key: [t]\n    limit: 1\n    on_error: false\n"), `r.yaml:5: rules[0].on_error: must be one of "local", "open", "closed" (got boolean false)`},
		{"shadow yes", rule("    key: [t]\n    limit: 1\n    shadow: yes\n"), `r.yaml:5: rules[0].shadow: must be true or false (got string "yes")`},
		{"start_empty number", rule("    key: [t]\n    limit: 1\n    start_empty: 1\n"), "r.yaml:5: rules[0].start_empty: must be true or false (got integer 1)"},
		{"reclaim negative", rule("    key: [t]\n    limit: 1\n    partition_reclaim_after: -1s\n"), "r.yaml:5: rules[0].partition_reclaim_after: must be >= 0 (0 turns reclaiming off)"},
		{"reclaim too long", rule("    key: [t]\n    limit: 1\n    partition_reclaim_after: 25h\n"), "r.yaml:5: rules[0].partition_reclaim_after: must be at most 24h"},
		{"reclaim region scope", rule("    key: [t]\n    limit: 1\n    scope: region\n    partition_reclaim_after: 10s\n"),
			"r.yaml:6: rules[0].partition_reclaim_after: only applies to scope: global (a region-scoped rule shares nothing to reclaim)"},

		{"problems in document order", "rules:\n  - {name: b, key: [t], limit: 0}\n  - name: A\n    key: []\n    limit: 1\n",
			"r.yaml:2: rules[0].limit: must be > 0\n" +
				"r.yaml:3: rules[1].name: must match [a-z0-9][a-z0-9._-]* (got \"A\")\n" +
				"r.yaml:4: rules[1].key: must not be empty"},
		{"too many rules", "rules:\n" + strings.Repeat("- {}\n", MaxRules+1), "r.yaml:1: rules: too many rules (10001; the limit is 10000)"},
		{"too many problems", "rules: []\n" + strings.Repeat("k: 1\n", 2+MaxProblems),
			"r.yaml:2: k: unknown field (known: rules)\n" +
				func() (s string) {
					for line := 3; line <= MaxProblems+1; line++ {
						s += "r.yaml:" + strconv.Itoa(line) + ": k: duplicate key (first at line 2)\n"
					}
					return s
				}() +
				"r.yaml: 2 more problems not shown (at most 100 are reported)"},
		{"too large", "rules: []\n" + strings.Repeat("#", MaxDocumentSize), "r.yaml: document is larger than 4194304 bytes (4 MiB)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse("r.yaml", []byte(tc.doc))
			if err == nil {
				t.Fatalf("Parse: got set with %d rules, want error %q", len(s.Rules()), tc.want)
			}
			if s != nil {
				t.Errorf("Parse: got a set with the error, want nil")
			}
			if diff := cmp.Diff(tc.want, err.Error()); diff != "" {
				t.Errorf("Error() (-want +got):\n%s", diff)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("errors.Is(err, ErrInvalid): got false, want true")
			}
		})
	}
}

func TestErrorsAs(t *testing.T) {
	_, err := Parse("rules.yaml", []byte(rule("    key: [t]\n    limit: 1\n    period: 0s\n    cost: 0\n")))
	var fe *FieldError
	if !errors.As(err, &fe) {
		t.Fatalf("errors.As(%v, *FieldError): got false, want true", err)
	}
	want := &FieldError{File: "rules.yaml", Line: 5, Field: "rules[0].period", Msg: "must be > 0"}
	if diff := cmp.Diff(want, fe); diff != "" {
		t.Errorf("first FieldError (-want +got):\n%s", diff)
	}
	if got, want := fe.Error(), "rules.yaml:5: rules[0].period: must be > 0"; got != want {
		t.Errorf("FieldError.Error(): got %q, want %q", got, want)
	}
	var es Errors
	if !errors.As(err, &es) || len(es) != 2 {
		t.Fatalf("errors.As(Errors): got %d problems, want 2", len(es))
	}
	if !errors.Is(fe, ErrInvalid) {
		t.Errorf("errors.Is(FieldError, ErrInvalid): got false, want true")
	}
}

func TestLoadFile(t *testing.T) {
	s, err := LoadFile(filepath.Join("testdata", "example.yaml"))
	if err != nil {
		t.Fatalf("LoadFile(example.yaml): got error %v, want none", err)
	}
	// regiond embeds a copy of this file as its default policy.
	want := []*Rule{{
		Name: "requests-per-tenant", Key: []string{"tenant"}, Algorithm: AlgorithmTokenBucket, Limit: 1000, Period: time.Second, Burst: 2000, Cost: 1,
		Scope: ScopeGlobal, OnError: OnErrorLocal, Line: 8,
	}, {
		Name: "transfers-per-tenant", Match: []Descriptor{{"method", "POST"}, {"route", "/v1/transfers"}}, Key: []string{"tenant"},
		Algorithm: AlgorithmTokenBucket, Limit: 500, Period: time.Second, Burst: 1000, Cost: 10, Scope: ScopeGlobal, OnError: OnErrorClosed, Line: 17,
	}, {
		Name: "requests-per-ip", Key: []string{"ip"}, Algorithm: AlgorithmTokenBucket, Limit: 20, Period: time.Second, Burst: 40, Cost: 1,
		Scope: ScopeRegion, OnError: OnErrorOpen, Line: 29,
	}, {
		Name: "search-per-tenant-shadow", Match: []Descriptor{{"route", "/v1/search"}}, Key: []string{"tenant", "plan"},
		Algorithm: AlgorithmTokenBucket, Limit: 6000, Period: time.Minute, Burst: 200, Cost: 1, Scope: ScopeGlobal, OnError: OnErrorLocal, Shadow: true, Line: 38,
	}}
	if diff := cmp.Diff(want, s.Rules()); diff != "" {
		t.Errorf("example.yaml rules (-want +got):\n%s", diff)
	}

	_, err = LoadFile(filepath.Join(t.TempDir(), "missing.yaml"))
	if !errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrInvalid) {
		t.Errorf("LoadFile(missing): got %v, want a not-exist error that is not ErrInvalid", err)
	}

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("rules: [{name: a}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = LoadFile(bad)
	var fe *FieldError
	if !errors.As(err, &fe) || fe.File != bad {
		t.Errorf("LoadFile(bad): got %v, want FieldErrors naming %s", err, bad)
	}
}

func TestParseMaxRules(t *testing.T) {
	var b strings.Builder
	b.WriteString("rules:\n")
	for i := range MaxRules {
		b.WriteString("- {name: r")
		b.WriteString(strings.Repeat("x", i%3))
		b.WriteString(strconv.Itoa(i))
		b.WriteString(", key: [t], limit: 1}\n")
	}
	s, err := Parse("r.yaml", []byte(b.String()))
	if err != nil {
		t.Fatalf("Parse(%d rules): got error %v, want none", MaxRules, err)
	}
	if got := len(s.Rules()); got != MaxRules {
		t.Errorf("rules: got %d, want %d", got, MaxRules)
	}
}
