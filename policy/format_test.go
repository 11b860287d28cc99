package policy

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// sameRules compares rules in every exported field but Line; zones by name
// (each Parse loads its own), nil only equal to nil.
var sameRules = cmp.Options{
	cmpopts.IgnoreFields(Rule{}, "Line"),
	cmp.Comparer(func(a, b *time.Location) bool {
		return (a == nil) == (b == nil) && (a == nil || a.String() == b.String())
	}),
}

// checkRoundTrip asserts that Format writes s's rules as a document that
// Parse reads back to the same Version and equal rules, and that
// formatting that again gives the same document.
func checkRoundTrip(t testing.TB, s *Set) {
	t.Helper()
	doc := Format(s.Rules())
	again, err := Parse("formatted.yaml", doc)
	if err != nil {
		t.Fatalf("parsing Format's document: got error %v, want none\n%s", err, doc)
	}
	if again.Version() != s.Version() {
		t.Fatalf("parsing Format's document: got Version %s, want %s\n%s", again.Version(), s.Version(), doc)
	}
	if diff := cmp.Diff(s.Rules(), again.Rules(), sameRules); diff != "" {
		t.Fatalf("parsing Format's document: rules differ (-want +got):\n%s\n%s", diff, doc)
	}
	if twice := Format(again.Rules()); string(twice) != string(doc) {
		t.Fatalf("Format is not stable: got\n%s\nthen\n%s", doc, twice)
	}
}

// readSeed returns the document of a []byte fuzz seed file.
func readSeed(t testing.TB, file string) []byte {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	body, ok := strings.CutPrefix(string(raw), "go test fuzz v1\n[]byte(")
	body, ok2 := strings.CutSuffix(strings.TrimSpace(body), ")")
	doc, err := strconv.Unquote(body)
	if !ok || !ok2 || err != nil {
		t.Fatalf("%s: not a []byte fuzz seed", file)
	}
	return []byte(doc)
}

// validSeeds returns example.yaml and the valid-* seeds of FuzzParse.
func validSeeds(t testing.TB) map[string][]byte {
	t.Helper()
	example, err := os.ReadFile(filepath.Join("testdata", "example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string][]byte{"example.yaml": example}
	files, err := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzParse", "valid-*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("seed corpus: got %d files (%v), want some", len(files), err)
	}
	for _, file := range files {
		docs[filepath.Base(file)] = readSeed(t, file)
	}
	return docs
}

func TestFormatRoundTripsSeeds(t *testing.T) {
	for name, doc := range validSeeds(t) {
		t.Run(name, func(t *testing.T) {
			s, err := Parse(name, doc)
			if err != nil {
				t.Fatal(err)
			}
			checkRoundTrip(t, s)
		})
	}
}

// TestFormatStrings round-trips descriptor values, names and clients that
// YAML reads otherwise unless they are quoted.
func TestFormatStrings(t *testing.T) {
	for _, v := range []string{
		"a: b", "a #b", "#x", "x#", `"`, `'`, `\`, `a"b'c\d`, " lead", "trail ", "  ", "\t", "tab\there",
		"line\nbreak", "trailing\n", "\n", "\r\n", "cr\rhere", "nel\u0085", "ls\u2028ps\u2029", "\ufeffbom",
		"\x00nul", "\x07bell", "\x1b[0m", "\x7f", "\u00a0nbsp", "é", "日本語", "emoji 😀", "\U0010ffff", "\ue000",
		"true", "false", "True", "null", "Null", "~", "yes", "no", "on", "1", "-1", "+1", "1.10", "0x10", "0o7",
		"1e3", "1_000", ".inf", "-.Inf", ".nan", "2001-12-14", "2001-12-14T21:59:43.10-05:00", "12:30:00",
		"<<", "=", "-", "- x", "? x", "--- x", "...", "&a", "*a", "!tag", "!!str", "%YAML", "@x", "`x",
		"[a]", "{a: b}", "a, b", "a,b", "a]", "a}", "|", ">", "|-\n x", "'quoted'", `"quoted"`,
		strings.Repeat("long value ", 90), "/v1/transfers", "POST",
	} {
		doc := "rules:\n  - name: r\n    match: {k: " + strconv.Quote(v) + "}\n    key: [t]\n    limit: 1\n"
		s, err := Parse("strings.yaml", []byte(doc))
		if err != nil {
			if strings.Contains(err.Error(), "rules[0].match") {
				continue // a value Parse refuses (empty, too long) has nothing to round-trip
			}
			t.Fatalf("value %q: %v", v, err)
		}
		if got := s.Rules()[0].Match[0].Value; got != v {
			t.Fatalf("value %q: the test document reads %q", v, got)
		}
		checkRoundTrip(t, s)
	}
	// Names, descriptor names and clients that YAML would read as numbers,
	// booleans, nulls or timestamps.
	s, err := Parse("names.yaml", []byte(`rules:
  - name: "1"
    match: {"true": "null", "1e3": x, "2001-12-14": y, "a:b": z, "null": "*"}
    key: ["0x10", "-", "1_000", "a/b", ".inf"]
    limit: 1
    clients: ["spiffe://example.org/ns/a", "svc-*", "1", "true", "a#b"]
  - {name: "2001-12-14", key: [t], limit: 1}
  - {name: "0.5", key: [t], limit: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	checkRoundTrip(t, s)
}

// TestFormat shows what Format writes: the fields that are not Parse's
// defaults, in the order Parse lists them.
func TestFormat(t *testing.T) {
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"no rules", "rules: []\n", "rules: []\n"},
		{
			"defaults left out",
			`rules: [{name: a, key: [t], limit: 5, period: 1s, burst: 5, cost: 1, scope: global, on_error: local, shadow: false, start_empty: false, partition_reclaim_after: 0}]`,
			"rules:\n  - name: a\n    key: [t]\n    limit: 5\n",
		},
		{
			"every field",
			`rules:
  - name: transfers
    match: {route: /v1/transfers, method: POST}
    key: [tenant, plan]
    limit: 500
    period: 1m
    burst: 1000
    cost: 10
    scope: global
    on_error: closed
    shadow: true
    partition_reclaim_after: 90s
    start_empty: true
    clients: [svc-a, svc-b]
`,
			"rules:\n  - name: transfers\n    match: {method: POST, route: /v1/transfers}\n    key: [tenant, plan]\n" +
				"    limit: 500\n    period: 1m0s\n    burst: 1000\n    cost: 10\n    on_error: closed\n    shadow: true\n" +
				"    partition_reclaim_after: 1m30s\n    start_empty: true\n    clients:\n      - svc-a\n      - svc-b\n",
		},
	} {
		s, err := Parse(tc.name, []byte(tc.doc))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if diff := cmp.Diff(tc.want, string(Format(s.Rules()))); diff != "" {
			t.Errorf("%s: Format (-want +got):\n%s", tc.name, diff)
		}
		checkRoundTrip(t, s)
	}
}

// TestFormatFixedWindows round-trips every kind of window: calendar words
// (24h is day), durations that divide a day, and time zones.
func TestFormatFixedWindows(t *testing.T) {
	s, err := Parse("windows.yaml", []byte(`rules:
  - {name: day, key: [t], limit: 10, algorithm: fixed_window, period: 24h}
  - {name: week, key: [t], limit: 10, algorithm: fixed_window, period: week, time_zone: America/New_York}
  - {name: month, key: [t], limit: 9, algorithm: fixed_window, period: month, cost: 3, time_zone: UTC}
  - {name: quarter, key: [t], limit: 5, algorithm: fixed_window, period: 15m, time_zone: Asia/Kathmandu}
  - {name: second, key: [t], limit: 5, algorithm: fixed_window}
  - {name: etc, key: [t], limit: 5, algorithm: fixed_window, period: 2h, time_zone: Etc/UTC}
`))
	if err != nil {
		t.Fatal(err)
	}
	checkRoundTrip(t, s)
}

// TestDeriveRefuses checks that a rule Parse would refuse makes Derive
// fail with Parse's ErrInvalid rather than come back changed.
func TestDeriveRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		rule Rule
	}{
		{"no limit", Rule{Name: "a", Key: []string{"t"}, Period: time.Second, Burst: 1, Cost: 1}},
		{"bad name", Rule{Name: "A", Key: []string{"t"}, Limit: 1, Period: time.Second, Burst: 1, Cost: 1}},
		{"cost above burst", Rule{Name: "a", Key: []string{"t"}, Limit: 1, Period: time.Second, Burst: 1, Cost: 2}},
		{"not UTF-8", Rule{Name: "a", Match: []Descriptor{{"k", "\xff"}}, Key: []string{"t"}, Limit: 1, Period: time.Second, Burst: 1, Cost: 1}},
	} {
		if s, err := Derive("derived", []*Rule{&tc.rule}); err == nil {
			t.Errorf("%s: got set %q, want an error", tc.name, s.Source())
		}
	}
}

// FuzzFormat checks that for every document Parse accepts, Format writes
// one that Parse reads back to the same Version and equal rules. Seeds:
// testdata/fuzz/FuzzFormat, example.yaml and FuzzParse's valid-* seeds.
func FuzzFormat(f *testing.F) {
	for _, doc := range validSeeds(f) {
		f.Add(doc)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse("fuzz.yaml", data)
		if err != nil {
			return
		}
		checkRoundTrip(t, s)
	})
}

// TestFuzzFormatSeeds keeps FuzzFormat's committed corpus meaningful: every
// seed is a document Parse accepts, so that the fuzz test round-trips it
// instead of returning early.
func TestFuzzFormatSeeds(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzFormat", "*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("seed corpus: got %d files (%v), want some", len(files), err)
	}
	for _, file := range files {
		if _, err := Parse(file, readSeed(t, file)); err != nil {
			t.Errorf("%s: got error %v, want none", filepath.Base(file), err)
		}
	}
}
