package policy

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzParse checks that Parse never panics and either rejects a document
// with ErrInvalid problems or returns a valid Set whose Source parses again
// to the same Version. Seeds: testdata/fuzz/FuzzParse and example.yaml.
func FuzzParse(f *testing.F) {
	example, err := os.ReadFile(filepath.Join("testdata", "example.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(example)
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse("fuzz.yaml", data)
		if err != nil {
			if s != nil {
				t.Fatalf("Parse: got a set and error %v, want only the error", err)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Parse: got error %v, want one wrapping ErrInvalid", err)
			}
			var es Errors
			if !errors.As(err, &es) || len(es) == 0 {
				t.Fatalf("Parse: got %T, want non-empty Errors", err)
			}
			for _, e := range es {
				if e.File != "fuzz.yaml" || e.Msg == "" || strings.Contains(e.Error(), "\n") {
					t.Fatalf("Parse: got problem %#v, want file fuzz.yaml and a one-line message", e)
				}
			}
			return
		}
		again, err := Parse("again.yaml", s.Source())
		if err != nil {
			t.Fatalf("re-parsing Source: got error %v, want none", err)
		}
		if again.Version() != s.Version() {
			t.Fatalf("re-parsing Source: got Version %s, want %s", again.Version(), s.Version())
		}
		// Format writes the rules as a document that means the same.
		formatted, err := Parse("formatted.yaml", Format(s.Rules()))
		if err != nil {
			t.Fatalf("parsing Format's document: %v\n%s", err, Format(s.Rules()))
		}
		if formatted.Version() != s.Version() {
			t.Fatalf("parsing Format's document: got Version %s, want %s\n%s", formatted.Version(), s.Version(), Format(s.Rules()))
		}
		for _, r := range s.Rules() {
			checkValid(t, r)
			// A request with exactly the rule's descriptors (a prefix's
			// value being the prefix) matches it, unless its except
			// excludes the request or another rule applying replaces it;
			// and Match returns what a naive scan of every rule does.
			ds := append([]Descriptor(nil), r.Match...)
			ds = append(ds, r.MatchPrefix...)
			for _, k := range r.Key {
				ds = append(ds, Descriptor{k, "v"})
			}
			if len(r.Except) == 0 && !r.Applies(ds) {
				t.Fatalf("Applies(%v): rule %q does not apply to its own descriptors", ds, r.Name)
			}
			if got, want := names(s.Match(nil, ds)), names(naiveMatch(s, ds)); !slices.Equal(got, want) {
				t.Fatalf("Match(%v): got %v, want %v", ds, got, want)
			}
			if r.Applies(ds) && len(s.replacers(r, ds)) == 0 && !slices.Contains(s.Match(nil, ds), r) {
				t.Fatalf("Match(%v): rule %q missing", ds, r.Name)
			}
		}
	})
}

// replacers returns the rules applying to ds that replace r.
func (s *Set) replacers(r *Rule, ds []Descriptor) []string {
	var out []string
	for _, q := range s.Rules() {
		if q != r && q.Applies(ds) && slices.Contains(q.Replaces, r.Name) {
			out = append(out, q.Name)
		}
	}
	return out
}

// checkValid asserts the invariants Parse promises for every rule of a Set.
func checkValid(t *testing.T, r *Rule) {
	t.Helper()
	ok := validName(r.Name) && len(r.Name) <= maxNameLen &&
		len(r.Key) > 0 && r.Limit > 0 && r.Limit <= MaxTokens &&
		r.Period > 0 && r.Period <= MaxPeriod && r.Cost > 0 && r.Burst >= r.Cost && r.Burst <= MaxTokens &&
		(r.Scope == ScopeGlobal || r.Scope == ScopeRegion) &&
		(r.OnError == OnErrorLocal || r.OnError == OnErrorOpen || r.OnError == OnErrorClosed) &&
		r.PartitionReclaimAfter >= 0 && r.PartitionReclaimAfter <= MaxReclaimAfter &&
		validAlgorithm(r) &&
		slices.IsSortedFunc(r.Match, func(a, b Descriptor) int { return strings.Compare(a.Key, b.Key) })
	if !ok {
		t.Fatalf("Parse: got invalid rule %+v", r)
	}
}

// validAlgorithm checks what Parse promises of each algorithm: a fixed
// window has a zone, a period that divides a day or a calendar word with
// its nominal length, no burst of its own and never starts empty; a token
// bucket has neither zone nor calendar.
func validAlgorithm(r *Rule) bool {
	if r.Algorithm == AlgorithmTokenBucket {
		return r.Location == nil && r.Calendar == ""
	}
	if r.Algorithm != AlgorithmFixedWindow || r.Location == nil || r.Burst != r.Limit || r.StartEmpty {
		return false
	}
	switch r.Calendar {
	case "":
		return r.Period%time.Second == 0 && NominalDay%r.Period == 0 && r.Period < NominalDay
	case CalendarDay, CalendarWeek, CalendarMonth:
		return r.Period == r.Calendar.nominal()
	}
	return false
}

// TestFuzzSeeds keeps the committed corpus honest: seeds named valid-* parse
// and seeds named invalid-* do not.
func TestFuzzSeeds(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzParse", "*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("seed corpus: got %d files (%v), want some", len(files), err)
	}
	for _, file := range files {
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
		_, err = Parse(file, []byte(doc))
		switch name := filepath.Base(file); {
		case strings.HasPrefix(name, "valid-") && err != nil:
			t.Errorf("%s: got error %v, want none", name, err)
		case strings.HasPrefix(name, "invalid-") && err == nil:
			t.Errorf("%s: got no error, want one", name)
		}
	}
}
