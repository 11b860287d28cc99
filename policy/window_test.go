package policy

import (
	"fmt"
	"testing"
	"time"
	_ "time/tzdata" // the tests need the zones even where the system has no tzdata
)

// fixedRule parses a one-rule policy with algorithm: fixed_window and the
// given time_zone and period.
func fixedRule(t testing.TB, zone, period string) *Rule {
	t.Helper()
	doc := fmt.Sprintf("rules: [{name: w, key: [t], limit: 100, algorithm: fixed_window, time_zone: %q, period: %q}]", zone, period)
	s, err := Parse("w.yaml", []byte(doc))
	if err != nil {
		t.Fatalf("Parse(%s): %v", doc, err)
	}
	return s.Rules()[0]
}

func mustTime(t testing.TB, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestWindow pins the windows of instants where the calendar is awkward:
// DST changes, odd offsets, month ends, leap days, weeks, the zone
// database's far past (local mean time) and future (its rules extended).
// Times are written with the offset in effect, so each line shows what a
// clock on the wall showed.
func TestWindow(t *testing.T) {
	for _, tc := range []struct {
		zone, period, at, start, end string
	}{
		{"UTC", "1s", "2024-05-05T10:20:30.5Z", "2024-05-05T10:20:30Z", "2024-05-05T10:20:31Z"},
		{"UTC", "1m", "2024-05-05T10:20:30Z", "2024-05-05T10:20:00Z", "2024-05-05T10:21:00Z"},
		{"UTC", "5m", "2024-05-05T10:24:59.999999999Z", "2024-05-05T10:20:00Z", "2024-05-05T10:25:00Z"},
		{"UTC", "15m", "2024-05-05T10:20:30Z", "2024-05-05T10:15:00Z", "2024-05-05T10:30:00Z"},
		{"UTC", "1h", "2024-05-05T11:00:00Z", "2024-05-05T11:00:00Z", "2024-05-05T12:00:00Z"},
		{"UTC", "6h", "2024-05-05T10:20:30Z", "2024-05-05T06:00:00Z", "2024-05-05T12:00:00Z"},
		{"UTC", "432s", "2024-05-05T10:20:30Z", "2024-05-05T10:19:12Z", "2024-05-05T10:26:24Z"},
		{"UTC", "1h", "1969-12-31T23:30:00Z", "1969-12-31T23:00:00Z", "1970-01-01T00:00:00Z"},
		{"UTC", "24h", "2024-02-29T12:00:00Z", "2024-02-29T00:00:00Z", "2024-03-01T00:00:00Z"},
		{"UTC", "day", "2024-02-28T23:59:59Z", "2024-02-28T00:00:00Z", "2024-02-29T00:00:00Z"},

		// Months of 28 to 31 days; leap years by the 4, 100 and 400 rules.
		{"UTC", "month", "2024-02-29T23:59:59.999Z", "2024-02-01T00:00:00Z", "2024-03-01T00:00:00Z"},
		{"UTC", "month", "2023-02-15T00:00:00Z", "2023-02-01T00:00:00Z", "2023-03-01T00:00:00Z"},
		{"UTC", "month", "2000-02-29T00:00:00Z", "2000-02-01T00:00:00Z", "2000-03-01T00:00:00Z"},
		{"UTC", "month", "1900-02-28T12:00:00Z", "1900-02-01T00:00:00Z", "1900-03-01T00:00:00Z"},
		{"UTC", "month", "2024-01-31T12:00:00Z", "2024-01-01T00:00:00Z", "2024-02-01T00:00:00Z"},
		{"UTC", "month", "2024-04-30T23:59:59Z", "2024-04-01T00:00:00Z", "2024-05-01T00:00:00Z"},
		{"UTC", "month", "2024-12-31T23:59:59Z", "2024-12-01T00:00:00Z", "2025-01-01T00:00:00Z"},
		{"UTC", "month", "2025-01-01T00:00:00Z", "2025-01-01T00:00:00Z", "2025-02-01T00:00:00Z"},

		// Weeks start on Monday, also across a year's end and before 1970.
		{"UTC", "week", "2024-01-07T23:59:59Z", "2024-01-01T00:00:00Z", "2024-01-08T00:00:00Z"},
		{"UTC", "week", "2024-01-01T00:00:00Z", "2024-01-01T00:00:00Z", "2024-01-08T00:00:00Z"},
		{"UTC", "week", "2024-12-31T10:00:00Z", "2024-12-30T00:00:00Z", "2025-01-06T00:00:00Z"},
		{"UTC", "week", "1970-01-01T00:00:00Z", "1969-12-29T00:00:00Z", "1970-01-05T00:00:00Z"},
		{"UTC", "week", "1969-12-28T23:59:59Z", "1969-12-22T00:00:00Z", "1969-12-29T00:00:00Z"},

		// Europe/Berlin springs forward from 02:00 to 03:00 on 2024-03-31: the
		// skipped hour has no window and the day lasts 23 hours.
		{"Europe/Berlin", "1h", "2024-03-31T01:59:59+01:00", "2024-03-31T01:00:00+01:00", "2024-03-31T03:00:00+02:00"},
		{"Europe/Berlin", "1h", "2024-03-31T03:00:00+02:00", "2024-03-31T03:00:00+02:00", "2024-03-31T04:00:00+02:00"},
		{"Europe/Berlin", "2h", "2024-03-31T01:30:00+01:00", "2024-03-31T00:00:00+01:00", "2024-03-31T03:00:00+02:00"},
		{"Europe/Berlin", "6h", "2024-03-31T05:00:00+02:00", "2024-03-31T00:00:00+01:00", "2024-03-31T06:00:00+02:00"},
		{"Europe/Berlin", "day", "2024-03-31T12:00:00+02:00", "2024-03-31T00:00:00+01:00", "2024-04-01T00:00:00+02:00"},
		{"Europe/Berlin", "week", "2024-03-31T23:00:00+02:00", "2024-03-25T00:00:00+01:00", "2024-04-01T00:00:00+02:00"},
		{"Europe/Berlin", "month", "2024-03-31T23:59:59+02:00", "2024-03-01T00:00:00+01:00", "2024-04-01T00:00:00+02:00"},
		// It falls back from 03:00 to 02:00 on 2024-10-27: the clock shows
		// 02:00 twice, and each time an hourly window starts; the day lasts 25.
		{"Europe/Berlin", "1h", "2024-10-27T02:30:00+02:00", "2024-10-27T02:00:00+02:00", "2024-10-27T02:00:00+01:00"},
		{"Europe/Berlin", "1h", "2024-10-27T02:30:00+01:00", "2024-10-27T02:00:00+01:00", "2024-10-27T03:00:00+01:00"},
		{"Europe/Berlin", "2h", "2024-10-27T02:30:00+02:00", "2024-10-27T02:00:00+02:00", "2024-10-27T02:00:00+01:00"},
		{"Europe/Berlin", "2h", "2024-10-27T03:30:00+01:00", "2024-10-27T02:00:00+01:00", "2024-10-27T04:00:00+01:00"},
		{"Europe/Berlin", "6h", "2024-10-27T05:00:00+01:00", "2024-10-27T00:00:00+02:00", "2024-10-27T06:00:00+01:00"},
		{"Europe/Berlin", "24h", "2024-10-27T12:00:00+01:00", "2024-10-27T00:00:00+02:00", "2024-10-28T00:00:00+01:00"},
		// Local mean time (+00:53:28) until 1893, then a jump over midnight.
		{"Europe/Berlin", "1h", "1850-06-01T11:30:00Z", "1850-06-01T11:06:32Z", "1850-06-01T12:06:32Z"},
		{"Europe/Berlin", "day", "1850-06-01T11:30:00Z", "1850-05-31T23:06:32Z", "1850-06-01T23:06:32Z"},
		{"Europe/Berlin", "day", "1893-04-01T12:00:00+01:00", "1893-03-31T23:06:32Z", "1893-04-02T00:00:00+01:00"},
		{"Europe/Berlin", "1h", "1893-04-01T00:30:00+01:00", "1893-03-31T23:06:32Z", "1893-04-01T01:00:00+01:00"},
		// 1916: set back from 01:00 to 00:00, so midnight shows twice; the day
		// starts at the first.
		{"Europe/Berlin", "day", "1916-10-01T00:30:00+01:00", "1916-10-01T00:00:00+02:00", "1916-10-02T00:00:00+01:00"},
		{"Europe/Berlin", "1h", "1916-10-01T00:30:00+01:00", "1916-10-01T00:00:00+01:00", "1916-10-01T01:00:00+01:00"},
		{"Europe/Berlin", "day", "2300-07-01T12:00:00+02:00", "2300-07-01T00:00:00+02:00", "2300-07-02T00:00:00+02:00"},
		{"Europe/Berlin", "month", "9999-11-30T23:59:59+01:00", "9999-11-01T00:00:00+01:00", "9999-12-01T00:00:00+01:00"},

		// America/New_York: 02:00 EST to 03:00 EDT; 02:00 EDT back to 01:00 EST.
		{"America/New_York", "1h", "2024-03-10T01:59:59-05:00", "2024-03-10T01:00:00-05:00", "2024-03-10T03:00:00-04:00"},
		{"America/New_York", "day", "2024-03-10T12:00:00-04:00", "2024-03-10T00:00:00-05:00", "2024-03-11T00:00:00-04:00"},
		{"America/New_York", "1h", "2024-11-03T01:30:00-04:00", "2024-11-03T01:00:00-04:00", "2024-11-03T01:00:00-05:00"},
		{"America/New_York", "1h", "2024-11-03T01:30:00-05:00", "2024-11-03T01:00:00-05:00", "2024-11-03T02:00:00-05:00"},
		{"America/New_York", "day", "2024-11-03T12:00:00-05:00", "2024-11-03T00:00:00-04:00", "2024-11-04T00:00:00-05:00"},

		// Half- and three-quarter-hour offsets: windows follow the local clock.
		{"Asia/Kolkata", "1h", "2024-06-01T10:45:00+05:30", "2024-06-01T10:00:00+05:30", "2024-06-01T11:00:00+05:30"},
		{"Asia/Kolkata", "15m", "2024-06-01T10:50:00+05:30", "2024-06-01T10:45:00+05:30", "2024-06-01T11:00:00+05:30"},
		{"Asia/Kolkata", "day", "2024-06-01T03:00:00Z", "2024-05-31T18:30:00Z", "2024-06-01T18:30:00Z"},
		{"Asia/Kolkata", "month", "2024-06-30T20:00:00Z", "2024-07-01T00:00:00+05:30", "2024-08-01T00:00:00+05:30"},
		{"Asia/Kathmandu", "1h", "2024-06-01T10:30:00+05:45", "2024-06-01T10:00:00+05:45", "2024-06-01T11:00:00+05:45"},
		{"Asia/Kathmandu", "30m", "2024-06-01T10:50:00+05:45", "2024-06-01T10:30:00+05:45", "2024-06-01T11:00:00+05:45"},
		{"Asia/Kathmandu", "day", "2024-06-01T18:14:59Z", "2024-06-01T00:00:00+05:45", "2024-06-02T00:00:00+05:45"},
		{"Asia/Kathmandu", "day", "2024-06-01T18:15:00Z", "2024-06-02T00:00:00+05:45", "2024-06-03T00:00:00+05:45"},

		// Australia/Lord_Howe changes by 30 minutes: 02:00 to 02:30 in
		// October, 02:00 back to 01:30 in April. Set back onto 01:30, the
		// clock starts a half-hour window but not an hourly one.
		{"Australia/Lord_Howe", "1h", "2024-10-06T01:45:00+10:30", "2024-10-06T01:00:00+10:30", "2024-10-06T02:30:00+11:00"},
		{"Australia/Lord_Howe", "1h", "2024-10-06T02:45:00+11:00", "2024-10-06T02:30:00+11:00", "2024-10-06T03:00:00+11:00"},
		{"Australia/Lord_Howe", "1h", "2024-04-07T01:45:00+10:30", "2024-04-07T01:00:00+11:00", "2024-04-07T02:00:00+10:30"},
		{"Australia/Lord_Howe", "30m", "2024-04-07T01:45:00+11:00", "2024-04-07T01:30:00+11:00", "2024-04-07T01:30:00+10:30"},
		{"Australia/Lord_Howe", "30m", "2024-04-07T01:45:00+10:30", "2024-04-07T01:30:00+10:30", "2024-04-07T02:00:00+10:30"},
		{"Australia/Lord_Howe", "day", "2024-04-07T12:00:00+10:30", "2024-04-07T00:00:00+11:00", "2024-04-08T00:00:00+10:30"},

		// America/Sao_Paulo (2018) changed at midnight: set back from 24:00 to
		// 23:00, so the repeated hour is the old day's; set forward from 00:00
		// to 01:00, so the day starts at 01:00.
		{"America/Sao_Paulo", "day", "2018-02-17T23:30:00-03:00", "2018-02-17T00:00:00-02:00", "2018-02-18T00:00:00-03:00"},
		{"America/Sao_Paulo", "12h", "2018-02-17T23:30:00-03:00", "2018-02-17T12:00:00-02:00", "2018-02-18T00:00:00-03:00"},
		{"America/Sao_Paulo", "1h", "2018-02-17T23:30:00-02:00", "2018-02-17T23:00:00-02:00", "2018-02-17T23:00:00-03:00"},
		{"America/Sao_Paulo", "1h", "2018-02-17T23:30:00-03:00", "2018-02-17T23:00:00-03:00", "2018-02-18T00:00:00-03:00"},
		{"America/Sao_Paulo", "day", "2018-11-04T12:00:00-02:00", "2018-11-04T01:00:00-02:00", "2018-11-05T00:00:00-02:00"},
		{"America/Sao_Paulo", "1h", "2018-11-03T23:30:00-03:00", "2018-11-03T23:00:00-03:00", "2018-11-04T01:00:00-02:00"},

		// America/Havana sets back from 01:00 to 00:00: midnight shows twice.
		{"America/Havana", "day", "2024-11-03T00:30:00-05:00", "2024-11-03T00:00:00-04:00", "2024-11-04T00:00:00-05:00"},
		{"America/Havana", "1h", "2024-11-03T00:30:00-04:00", "2024-11-03T00:00:00-04:00", "2024-11-03T00:00:00-05:00"},
		{"America/Havana", "1h", "2024-11-03T00:30:00-05:00", "2024-11-03T00:00:00-05:00", "2024-11-03T01:00:00-05:00"},
		{"America/Havana", "day", "2024-03-10T12:00:00-04:00", "2024-03-10T01:00:00-04:00", "2024-03-11T00:00:00-04:00"},

		// Pacific/Apia skipped 2011-12-30: it has no window, and that week has
		// six days.
		{"Pacific/Apia", "day", "2011-12-29T12:00:00-10:00", "2011-12-29T00:00:00-10:00", "2011-12-31T00:00:00+14:00"},
		{"Pacific/Apia", "day", "2011-12-31T00:00:00+14:00", "2011-12-31T00:00:00+14:00", "2012-01-01T00:00:00+14:00"},
		{"Pacific/Apia", "week", "2011-12-31T12:00:00+14:00", "2011-12-26T00:00:00-10:00", "2012-01-02T00:00:00+14:00"},
		{"Pacific/Apia", "1h", "2011-12-29T23:30:00-10:00", "2011-12-29T23:00:00-10:00", "2011-12-31T00:00:00+14:00"},

		// America/Sitka went back a whole day in 1867 (+14:58:47 to
		// -09:01:13): 18 October came twice, after the 19th had begun, so
		// the 19th's window holds the second 18th and lasts 48 hours.
		{"America/Sitka", "day", "1867-10-19T05:01:13Z", "1867-10-18T09:01:13Z", "1867-10-20T09:01:13Z"},

		// Antarctica/Troll changes by two hours.
		{"Antarctica/Troll", "1h", "2024-03-31T00:30:00Z", "2024-03-31T00:00:00Z", "2024-03-31T03:00:00+02:00"},
		{"Antarctica/Troll", "1h", "2024-10-27T01:30:00Z", "2024-10-27T01:00:00Z", "2024-10-27T02:00:00Z"},
	} {
		name := fmt.Sprintf("%s/%s/%s", tc.zone, tc.period, tc.at)
		t.Run(name, func(t *testing.T) {
			r := fixedRule(t, tc.zone, tc.period)
			start, end := r.Window(mustTime(t, tc.at))
			if want := mustTime(t, tc.start); !start.Equal(want) {
				t.Errorf("start: got %s, want %s", start.Format(time.RFC3339), tc.start)
			}
			if want := mustTime(t, tc.end); !end.Equal(want) {
				t.Errorf("end: got %s, want %s", end.Format(time.RFC3339), tc.end)
			}
			if start.Location() != r.Location || end.Location() != r.Location {
				t.Errorf("locations: got %v and %v, want %v", start.Location(), end.Location(), r.Location)
			}
		})
	}
}

func TestBoundaries(t *testing.T) {
	r := fixedRule(t, "Europe/Berlin", "1h")
	got := r.Boundaries(mustTime(t, "2024-10-27T02:30:00+02:00"))
	want := [4]int64{}
	for i, s := range []string{"2024-10-27T01:00:00+02:00", "2024-10-27T02:00:00+02:00", "2024-10-27T02:00:00+01:00", "2024-10-27T03:00:00+01:00"} {
		want[i] = mustTime(t, s).UnixMicro()
	}
	if got != want {
		t.Errorf("Boundaries: got %v, want %v", got, want)
	}
}

// TestWindowHandBuilt: a Rule built by hand with no Location is in UTC,
// and a 24h period without a Calendar is a calendar day.
func TestWindowHandBuilt(t *testing.T) {
	r := &Rule{Algorithm: AlgorithmFixedWindow, Limit: 1, Period: 24 * time.Hour}
	start, end := r.Window(mustTime(t, "2024-05-05T10:00:00+02:00"))
	if start.Location() != time.UTC || !start.Equal(mustTime(t, "2024-05-05T00:00:00Z")) || !end.Equal(mustTime(t, "2024-05-06T00:00:00Z")) {
		t.Errorf("Window: got [%s, %s), want the UTC day 2024-05-05", start, end)
	}
}

func TestWindowTokenBucketPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Errorf("Window of a token bucket: got no panic, want one")
		}
	}()
	(&Rule{Name: "tb", Limit: 1, Period: time.Second}).Window(time.Unix(0, 0))
}

func TestWindowAllocs(t *testing.T) {
	r := fixedRule(t, "Europe/Berlin", "month")
	at := mustTime(t, "2024-10-27T02:30:00+01:00")
	if n := testing.AllocsPerRun(100, func() { r.Window(at); r.Boundaries(at) }); n != 0 {
		t.Errorf("Window and Boundaries: got %v allocs, want 0", n)
	}
}

func BenchmarkWindow(b *testing.B) {
	at := mustTime(b, "2024-10-27T02:30:00+01:00")
	for _, period := range []string{"1m", "day", "month"} {
		r := fixedRule(b, "Europe/Berlin", period)
		b.Run(period, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				r.Boundaries(at)
			}
		})
	}
}
