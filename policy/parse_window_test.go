package policy

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// sameZone compares time zones by name: a *time.Location has unexported
// fields, and two loads of one zone are different pointers.
var sameZone = cmp.Comparer(func(a, b *time.Location) bool {
	return (a == nil) == (b == nil) && (a == nil || a.String() == b.String())
})

func TestParseFixedWindow(t *testing.T) {
	doc := `rules:
  - {name: per-second, key: [t], limit: 10, algorithm: fixed_window}
  - {name: daily, key: [t], limit: 1000, algorithm: fixed_window, period: 24h, time_zone: Europe/Berlin}
  - {name: weekly, key: [t], limit: 5000, algorithm: fixed_window, period: week, time_zone: Asia/Kolkata, cost: 5}
  - {name: monthly, key: [t], limit: 100000, algorithm: fixed_window, period: month, start_empty: false, partition_reclaim_after: 1h}
  - {name: quarter-hour, key: [t], limit: 50, algorithm: fixed_window, period: 15m, time_zone: UTC}
  - {name: long-bucket, key: [t], limit: 31, algorithm: token_bucket, period: 744h}
`
	s, err := Parse("r.yaml", []byte(doc))
	if err != nil {
		t.Fatalf("Parse: got error %v, want none", err)
	}
	berlin, kolkata := mustZone(t, "Europe/Berlin"), mustZone(t, "Asia/Kolkata")
	fixed := func(name string, line int, limit int64, period time.Duration, cal Calendar, loc *time.Location) *Rule {
		return &Rule{
			Name: name, Key: []string{"t"}, Algorithm: AlgorithmFixedWindow, Limit: limit, Period: period,
			Calendar: cal, Location: loc, Burst: limit, Cost: 1, Scope: ScopeGlobal, OnError: OnErrorLocal, Line: line,
		}
	}
	want := []*Rule{
		fixed("per-second", 2, 10, time.Second, "", time.UTC),
		fixed("daily", 3, 1000, 24*time.Hour, CalendarDay, berlin),
		fixed("weekly", 4, 5000, NominalWeek, CalendarWeek, kolkata),
		fixed("monthly", 5, 100000, NominalMonth, CalendarMonth, time.UTC),
		fixed("quarter-hour", 6, 50, 15*time.Minute, "", time.UTC),
		{
			Name: "long-bucket", Key: []string{"t"}, Algorithm: AlgorithmTokenBucket, Limit: 31, Period: 31 * 24 * time.Hour,
			Burst: 31, Cost: 1, Scope: ScopeGlobal, OnError: OnErrorLocal, Line: 7,
		},
	}
	want[2].Cost = 5
	want[3].PartitionReclaimAfter = time.Hour
	if diff := cmp.Diff(want, s.Rules(), sameZone); diff != "" {
		t.Errorf("rules (-want +got):\n%s", diff)
	}
	if got := s.Rule("monthly").Rate(); got != 100000/NominalMonth.Seconds() {
		t.Errorf("Rate of a monthly window: got %v, want limit / NominalMonth", got)
	}
}

func TestParseSharesZones(t *testing.T) {
	s := mustParse(t, `rules:
  - {name: a, key: [t], limit: 1, algorithm: fixed_window, period: day, time_zone: America/New_York}
  - {name: b, key: [t], limit: 1, algorithm: fixed_window, period: 1h, time_zone: America/New_York}
`)
	if a, b := s.Rule("a").Location, s.Rule("b").Location; a != b {
		t.Errorf("Location: got two loads of one zone (%p, %p), want one shared", a, b)
	}
}

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func TestParseWindowErrors(t *testing.T) {
	const fixed = "    key: [t]\n    limit: 10\n    algorithm: fixed_window\n" // lines 3 to 5
	const bucket = "    key: [t]\n    limit: 10\n"
	const divide = "must divide a day into windows of whole seconds, such as 1s, 10s, 1m, 5m, 15m, 1h, 2h, 6h, 12h or 24h; or be day, week or month"
	for _, tc := range []struct{ name, doc, want string }{
		{"algorithm", rule(bucket + "    algorithm: sliding_window\n"),
			`r.yaml:5: rules[0].algorithm: must be one of "token_bucket", "fixed_window" (got string "sliding_window")`},
		{"algorithm and a calendar period", rule(bucket + "    algorithm: fixed\n    period: day\n"),
			`r.yaml:5: rules[0].algorithm: must be one of "token_bucket", "fixed_window" (got string "fixed")` + "\n" +
				`r.yaml:6: rules[0].period: "day" is a calendar period, which only applies to algorithm: fixed_window (a token bucket's period is a duration such as "1m" or "720h")`},
		{"calendar period of a bucket", rule(bucket + "    period: month\n"),
			`r.yaml:5: rules[0].period: "month" is a calendar period, which only applies to algorithm: fixed_window (a token bucket's period is a duration such as "1m" or "720h")`},
		{"capitalised word of a bucket", rule(bucket + "    period: Month\n"),
			`r.yaml:5: rules[0].period: must be a Go duration such as "1s" or "500ms" (got "Month")`},
		{"time_zone of a bucket", rule(bucket + "    time_zone: UTC\n"),
			"r.yaml:5: rules[0].time_zone: only applies to algorithm: fixed_window (a token bucket has no windows to align)"},
		{"unknown zone", rule(fixed + "    time_zone: Europe/Atlantis\n"),
			`r.yaml:6: rules[0].time_zone: unknown time zone "Europe/Atlantis" (want an IANA name such as "Europe/Berlin" or "UTC")`},
		{"zone path", rule(fixed + "    time_zone: ../../etc/passwd\n"),
			`r.yaml:6: rules[0].time_zone: unknown time zone "../../etc/passwd" (want an IANA name such as "Europe/Berlin" or "UTC")`},
		{"Local zone", rule(fixed + "    time_zone: Local\n"),
			`r.yaml:6: rules[0].time_zone: must be an IANA time zone name such as "Europe/Berlin" ("Local" differs from machine to machine)`},
		{"empty zone", rule(fixed + "    time_zone: ''\n"), "r.yaml:6: rules[0].time_zone: must not be empty (omit it for UTC)"},
		{"zone not a string", rule(fixed + "    time_zone: 1\n"), "r.yaml:6: rules[0].time_zone: must be a string (got integer 1)"},
		{"period not dividing a day", rule(fixed + "    period: 7m\n"), "r.yaml:6: rules[0].period: " + divide + " (got 7m)"},
		{"period over a day", rule(fixed + "    period: 48h\n"), "r.yaml:6: rules[0].period: " + divide + " (got 48h)"},
		{"period of a month as hours", rule(fixed + "    period: 744h\n"), "r.yaml:6: rules[0].period: " + divide + " (got 744h)"},
		{"period below a second", rule(fixed + "    period: 500ms\n"), "r.yaml:6: rules[0].period: " + divide + " (got 500ms)"},
		{"period not whole seconds", rule(fixed + "    period: 1500ms\n"), "r.yaml:6: rules[0].period: " + divide + " (got 1500ms)"},
		{"period zero", rule(fixed + "    period: 0s\n"), "r.yaml:6: rules[0].period: must be > 0"},
		{"period negative", rule(fixed + "    period: -1h\n"), "r.yaml:6: rules[0].period: must be > 0"},
		{"period word", rule(fixed + "    period: monthly\n"),
			`r.yaml:6: rules[0].period: must be a Go duration such as "1m" or "1h", or one of "day", "week", "month" (got "monthly")`},
		{"period without unit", rule(fixed + "    period: 60\n"),
			`r.yaml:6: rules[0].period: must be a Go duration with a unit, such as "1s" or "500ms" (got integer 60)`},
		{"burst", rule(fixed + "    burst: 10\n"),
			"r.yaml:6: rules[0].burst: does not apply to algorithm: fixed_window (a window admits limit tokens)"},
		{"cost above limit", rule(fixed + "    cost: 11\n"), "r.yaml:6: rules[0].cost: must be <= limit (10), the tokens of one window"},
		{"start_empty", rule(fixed + "    start_empty: true\n"),
			"r.yaml:6: rules[0].start_empty: only applies to algorithm: token_bucket (every window starts with limit tokens)"},
		{"reclaim over a day", rule(fixed + "    partition_reclaim_after: 24h1s\n"),
			"r.yaml:6: rules[0].partition_reclaim_after: must be at most 24h"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse("r.yaml", []byte(tc.doc))
			if err == nil {
				t.Fatalf("Parse: got set with %d rules, want error %q", len(s.Rules()), tc.want)
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
