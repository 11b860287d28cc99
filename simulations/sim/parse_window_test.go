package sim

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/policy"
)

// keyWith is goodHead with fields added to its key group (line 5).
func keyWith(fields string) string {
	return strings.Replace(goodHead, "limit: 10 }", "limit: 10, "+fields+" }", 1)
}

// TestParseFixedWindow: a key group's fixed window is the policy's rule:
// its period (a duration dividing a day, or a calendar word) and time zone
// reach the generated policy, and every key runs that rule.
func TestParseFixedWindow(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skipf("no time zone database: %v", err)
	}
	tests := []struct {
		fields   string
		period   time.Duration
		calendar policy.Calendar
		loc      *time.Location
	}{
		{"algorithm: fixed_window, period: 1m", time.Minute, "", time.UTC},
		{"algorithm: fixed_window", time.Second, "", time.UTC},
		{"algorithm: fixed_window, period: 24h", 24 * time.Hour, policy.CalendarDay, time.UTC},
		{"algorithm: fixed_window, period: day, time_zone: Europe/Berlin", 24 * time.Hour, policy.CalendarDay, berlin},
		{"algorithm: fixed_window, period: week", policy.NominalWeek, policy.CalendarWeek, time.UTC},
		{`algorithm: fixed_window, period: month, time_zone: "Europe/Berlin"`, policy.NominalMonth, policy.CalendarMonth, berlin},
		{"algorithm: fixed_window, period: 15m, time_zone: UTC", 15 * time.Minute, "", time.UTC},
	}
	for _, tc := range tests {
		t.Run(tc.fields, func(t *testing.T) {
			sc := parseDoc(t, "s.yaml", keyWith(tc.fields))
			g := sc.Keys[0]
			if g.RuleAlgorithm != FixedWindow || g.Period != tc.period || g.Calendar != tc.calendar || g.Burst != g.Limit {
				t.Errorf("got algorithm %q, period %v, calendar %q, burst %d; want fixed_window, %v, %q, the limit", g.RuleAlgorithm, g.Period, g.Calendar, g.Burst, tc.period, tc.calendar)
			}
			w, err := newWorld(sc, Escrow)
			if err != nil {
				t.Fatal(err)
			}
			r := w.keys[0].rule
			if !r.FixedWindow() || r.Period != tc.period || r.Calendar != tc.calendar || r.Location.String() != tc.loc.String() || r.Burst != 10 {
				t.Errorf("got rule %+v, want a fixed window of %v (%q) in %v, burst 10", r, tc.period, tc.calendar, tc.loc)
			}
		})
	}
}

func TestParseFixedWindowErrors(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"burst", keyWith("algorithm: fixed_window, burst: 20"), "s.yaml:5: keys[0].burst: does not apply to algorithm: fixed_window (a window admits limit tokens)"},
		{"bad burst too", keyWith("algorithm: fixed_window, burst: 0"), "s.yaml:5: keys[0].burst: does not apply to algorithm: fixed_window"},
		{"period not dividing a day", keyWith("algorithm: fixed_window, period: 7m"), "s.yaml:5: keys[0].period: must divide a day into windows of whole seconds"},
		{"period word", keyWith("algorithm: fixed_window, period: fortnight"), `s.yaml:5: keys[0].period: must be a Go duration such as "1m" or "1h", or one of "day", "week", "month" (got "fortnight")`},
		{"calendar period on a bucket", keyWith("period: day"), `s.yaml:5: keys[0].period: "day" is a calendar period, which only applies to algorithm: fixed_window`},
		{"time zone on a bucket", keyWith("time_zone: Europe/Berlin"), "s.yaml:5: keys[0].time_zone: only applies to algorithm: fixed_window"},
		{"unknown time zone", keyWith("algorithm: fixed_window, time_zone: Mars/Olympus"), `s.yaml:5: keys[0].time_zone: unknown time zone "Mars/Olympus"`},
		{"local time zone", keyWith("algorithm: fixed_window, time_zone: Local"), `s.yaml:5: keys[0].time_zone: must be an IANA time zone name`},
		{"time zone not a string", keyWith("algorithm: fixed_window, time_zone: 3"), "s.yaml:5: keys[0].time_zone: must be a string (got integer 3)"},
		{"time zone a list", keyWith("algorithm: fixed_window, time_zone: [UTC]"), "s.yaml:5: keys[0].time_zone: must be a string (got a list)"},
		{"cost above the limit", keyWith("algorithm: fixed_window, cost: 11"), "s.yaml:5: keys[0].cost: must be <= limit (10), the tokens of one window"},
		{"on its own line", strings.Replace(goodHead, "  - { name: k, limit: 10 }", "  - name: k\n    limit: 10\n    algorithm: fixed_window\n    period: 7m", 1),
			"s.yaml:8: keys[0].period: must divide a day"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sc, err := Parse("s.yaml", []byte(tc.doc))
			if err == nil {
				t.Fatalf("got scenario %+v, want error %q", sc, tc.want)
			}
			var es Errors
			if !errors.As(err, &es) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("got %v, want Errors wrapping ErrInvalid", err)
			}
			if len(es) != 1 || !strings.Contains(es[0].Error(), tc.want) {
				t.Errorf("got errors\n%v\nwant exactly one, containing\n%s", err, tc.want)
			}
		})
	}
}

func TestParseStart(t *testing.T) {
	tests := []struct {
		doc  string
		want time.Time
	}{
		{goodHead, time.Date(2023, 11, 14, 22, 13, 20, 0, time.UTC)},
		{"start: 2026-03-29T00:58:00+01:00\n" + goodHead, time.Date(2026, 3, 28, 23, 58, 0, 0, time.UTC)},
		{`start: "2026-03-29T00:58:00.5Z"` + "\n" + goodHead, time.Date(2026, 3, 29, 0, 58, 0, 5e8, time.UTC)},
	}
	for _, tc := range tests {
		sc := parseDoc(t, "s.yaml", tc.doc)
		if !sc.Start.Equal(tc.want) {
			t.Errorf("%q: got start %v, want %v", strings.SplitN(tc.doc, "\n", 2)[0], sc.Start, tc.want)
		}
	}
	bad := []struct{ value, want string }{
		{"2026-03-29", `s.yaml:1: start: must be an RFC 3339 time with a date, a time and an offset, such as "2026-03-29T00:58:00+01:00" (got "2026-03-29")`},
		{"2026-03-29T00:58:00", `s.yaml:1: start: must be an RFC 3339 time with a date, a time and an offset`},
		{"tomorrow", `(got "tomorrow")`},
		{"1700000000", `s.yaml:1: start: must be an RFC 3339 time such as "2026-03-29T00:58:00+01:00" (got integer 1700000000)`},
		{"1969-12-31T23:00:00Z", "s.yaml:1: start: must be from 1971 to 2199 (got 1969-12-31T23:00:00Z)"},
		{"2200-01-01T00:00:00Z", "s.yaml:1: start: must be from 1971 to 2199"},
	}
	for _, tc := range bad {
		_, err := Parse("s.yaml", []byte("start: "+tc.value+"\n"+goodHead))
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("start: %s: got error %v, want one containing %s", tc.value, err, tc.want)
		}
	}
}
