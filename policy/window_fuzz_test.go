package policy

import (
	"math"
	"testing"
	"time"
)

// The zones the property tests range over: DST of one hour, 30 minutes
// (Lord_Howe) and two hours (Troll), changes at midnight (Sao_Paulo,
// Havana, Santiago), negative DST (Dublin), many changes a year
// (Casablanca), offsets of :30 and :45 (Kolkata, Kathmandu, St_Johns,
// Chatham), a skipped day (Apia), days repeated or skipped long ago
// (Sitka, Manila), and +14 (Kiritimati).
var windowZones = []string{
	"UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Antarctica/Troll",
	"America/Sao_Paulo", "America/Havana", "America/Santiago", "Europe/Dublin", "Africa/Casablanca",
	"Asia/Kolkata", "Asia/Kathmandu", "America/St_Johns", "Pacific/Chatham", "Pacific/Apia",
	"America/Sitka", "Asia/Manila", "Pacific/Kiritimati",
}

var windowPeriods = []string{
	"1s", "10s", "45s", "1m", "5m", "432s", "15m", "20m", "30m", "1h", "2h", "3h", "6h", "12h",
	"day", "week", "month",
}

// windowRules returns a rule for every zone and period, and each zone's
// day rule, indexed like windowZones.
func windowRules(t testing.TB) (rules [][]*Rule, days []*Rule) {
	for _, z := range windowZones {
		var rs []*Rule
		for _, p := range windowPeriods {
			rs = append(rs, fixedRule(t, z, p))
		}
		rules = append(rules, rs)
		days = append(days, fixedRule(t, z, "day"))
	}
	return rules, days
}

// The property tests stay a year inside the domain, so that the windows
// before and after are inside it too.
var (
	propMin = time.Date(2, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	propMax = time.Date(9998, 12, 31, 0, 0, 0, 0, time.UTC).Unix()
)

// checkWindow asserts what Window promises for rule r at t: t is inside its
// window; the window is whole seconds long, positive and at most its
// nominal length plus a day; it is the window of its own start, its end
// starts the next window and the instant before its start ends the
// previous one (so windows tile time); Boundaries agrees; and it nests in
// days: a day's start is a boundary of every shorter period, and weeks and
// months start on a day's start.
func checkWindow(t testing.TB, r, day *Rule, at time.Time) {
	t.Helper()
	start, end := r.Window(at)
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("%s %s at %s (%d): window [%s, %s): "+format,
			append([]any{r.Location, periodName(r), at.Format(time.RFC3339Nano), at.Unix(),
				start.Format(time.RFC3339), end.Format(time.RFC3339)}, args...)...)
	}
	longest := r.Period
	if r.Calendar == CalendarMonth {
		longest = 31 * NominalDay
	}
	switch length := end.Sub(start); {
	case at.Before(start) || !at.Before(end):
		fail("does not contain t")
	case start.Nanosecond() != 0 || end.Nanosecond() != 0:
		fail("not whole seconds")
	case length <= 0 || length > longest+25*time.Hour:
		fail("length %s out of (0, %s]", length, longest+25*time.Hour)
	}
	if s, e := r.Window(start); !s.Equal(start) || !e.Equal(end) {
		fail("Window(start) = [%s, %s)", s.Format(time.RFC3339), e.Format(time.RFC3339))
	}
	nextStart, nextEnd := r.Window(end)
	if !nextStart.Equal(end) {
		fail("Window(end) starts at %s", nextStart.Format(time.RFC3339))
	}
	prevStart, prevEnd := r.Window(start.Add(-time.Nanosecond))
	if !prevEnd.Equal(start) {
		fail("Window(start - 1ns) ends at %s", prevEnd.Format(time.RFC3339))
	}
	want := [4]int64{prevStart.UnixMicro(), start.UnixMicro(), end.UnixMicro(), nextEnd.UnixMicro()}
	if got := r.Boundaries(at); got != want {
		fail("Boundaries = %v, want %v", got, want)
	}
	switch r.Calendar {
	case "":
		if dayStart, _ := day.Window(at); !r.windowStart(dayStart).Equal(dayStart) {
			fail("the day's start %s is not a boundary", dayStart.Format(time.RFC3339))
		}
	case CalendarWeek, CalendarMonth:
		if !day.windowStart(start).Equal(start) {
			fail("does not start at a day's start")
		}
	}
}

func (r *Rule) windowStart(t time.Time) time.Time {
	s, _ := r.Window(t)
	return s
}

func periodName(r *Rule) string {
	if r.Calendar != "" {
		return string(r.Calendar)
	}
	return r.Period.String()
}

// FuzzWindow checks checkWindow's properties for any instant, zone and
// period. Seeds: instants at DST changes and calendar oddities.
func FuzzWindow(f *testing.F) {
	for _, s := range []string{
		"2024-03-31T01:00:00Z", "2024-10-27T00:59:59Z", "2024-04-06T15:00:00Z", "2024-10-05T15:30:00Z",
		"2018-02-18T02:00:00Z", "2018-11-04T03:00:00Z", "2011-12-30T10:00:00Z", "1867-10-19T00:31:13Z",
		"1844-12-31T15:56:08Z", "2024-02-29T23:59:59Z", "1970-01-01T00:00:00Z", "9998-06-01T00:00:00Z",
	} {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(v.Unix(), uint32(0), uint8(0), uint8(0))
	}
	rules, days := windowRules(f)
	f.Fuzz(func(t *testing.T, sec int64, nsec uint32, zone, period uint8) {
		if sec < propMin || sec > propMax {
			sec = propMin + floorMod(sec, propMax-propMin)
		}
		z := int(zone) % len(windowZones)
		r := rules[z][int(period)%len(windowPeriods)]
		checkWindow(t, r, days[z], time.Unix(sec, int64(nsec%1e9)))
	})
}

// TestWindowProperties runs checkWindow's properties on random instants:
// a third anywhere in the domain, a third in 1850-2150, and a third within
// two days of one of the zone's transitions.
func TestWindowProperties(t *testing.T) {
	rng := newRand(t)
	rules, days := windowRules(t)
	n := 5000
	if testing.Short() {
		n = 500
	}
	recentMin := time.Date(1850, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	recentMax := time.Date(2150, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	for range n {
		z := rng.IntN(len(windowZones))
		r := rules[z][rng.IntN(len(windowPeriods))]
		var sec int64
		switch rng.IntN(3) {
		case 0:
			sec = propMin + rng.Int64N(propMax-propMin)
		case 1:
			sec = recentMin + rng.Int64N(recentMax-recentMin)
		default:
			near := time.Unix(recentMin+rng.Int64N(recentMax-recentMin), 0).In(r.Location)
			if _, end := near.ZoneBounds(); !end.IsZero() {
				near = end
			}
			sec = near.Unix() + rng.Int64N(4*secondsPerDay) - 2*secondsPerDay
		}
		checkWindow(t, r, days[z], time.Unix(sec, rng.Int64N(1e9)))
	}
}

// TestWindowDefinition compares Window with the definition in window.go
// evaluated second by second, using nothing but time.Time.Zone, over the
// 26 hours either side of every transition of these zones in these years.
// A sub-day window starts where the clock shows a multiple of the period or
// was set forward past one; a calendar day starts where the clock first
// shows a date later than every date it showed before.
func TestWindowDefinition(t *testing.T) {
	spans := []struct {
		zone string
		year int
	}{
		{"Europe/Berlin", 2024}, {"Europe/Berlin", 1893}, {"Europe/Berlin", 1916}, {"Europe/Berlin", 2300},
		{"America/New_York", 2024}, {"Australia/Lord_Howe", 2024}, {"Antarctica/Troll", 2024},
		{"America/Sao_Paulo", 2018}, {"America/Havana", 2024}, {"Pacific/Apia", 2011},
		{"America/Sitka", 1867}, {"Asia/Kathmandu", 1986}, {"Pacific/Chatham", 2024},
	}
	if testing.Short() {
		spans = spans[:3]
	}
	periods := []string{"1m", "15m", "30m", "1h", "2h", "6h", "12h", "day"}
	for _, sp := range spans {
		rules := make([]*Rule, len(periods))
		for i, p := range periods {
			rules[i] = fixedRule(t, sp.zone, p)
		}
		loc := rules[0].Location
		from := time.Date(sp.year, 1, 1, 0, 0, 0, 0, loc)
		for _, change := range transitions(from, from.AddDate(1, 0, 0)) {
			bounds := definedBoundaries(loc, periods, change-26*3600, change+26*3600)
			for i, r := range rules {
				checkAgainst(t, r, bounds[i])
			}
		}
	}
}

// transitions lists the Unix seconds of from's zone changes in [from, to).
func transitions(from, to time.Time) []int64 {
	var out []int64
	for t := from; t.Before(to); {
		_, end := t.ZoneBounds()
		if end.IsZero() || !end.Before(to) {
			break
		}
		out = append(out, end.Unix())
		t = end
	}
	return out
}

// definedBoundaries returns, per period, the window starts in [from, to]
// by the definition, scanning every second. It asks the zone's offset once
// a minute, and every second of a minute whose ends differ (no zone
// changes twice within a minute).
func definedBoundaries(loc *time.Location, periods []string, from, to int64) [][]int64 {
	lookup := func(s int64) int64 {
		_, off := time.Unix(s, 0).In(loc).Zone()
		return int64(off)
	}
	minute, minuteOff, nextOff := int64(math.MinInt64), int64(0), int64(0)
	offset := func(s int64) int64 {
		if m := floorDiv(s, 60) * 60; m != minute {
			minute, minuteOff, nextOff = m, lookup(m), lookup(m+60)
		}
		if minuteOff == nextOff {
			return minuteOff
		}
		return lookup(s)
	}
	out := make([][]int64, len(periods))
	seconds := make([]int64, len(periods)) // 0 for day
	for i, p := range periods {
		if p != "day" {
			seconds[i] = int64(mustDuration(p) / time.Second)
		}
	}
	prev := offset(from - 1)
	latestDay := floorDiv(from-1+prev, secondsPerDay)
	for s := from; s <= to; s++ {
		off := offset(s)
		wall := s + off
		for i, d := range seconds {
			if d == 0 {
				if d := floorDiv(wall, secondsPerDay); d > latestDay {
					latestDay = d
					out[i] = append(out[i], s)
				}
				continue
			}
			shows := floorMod(wall, d) == 0
			setForwardPast := off > prev && (floorDiv(s+prev-1, d)+1)*d < wall // the first multiple >= the old reading
			if shows || setForwardPast {
				out[i] = append(out[i], s)
			}
		}
		prev = off
	}
	return out
}

func mustDuration(s string) time.Duration {
	d, err := time.ParseDuration(s)
	if err != nil {
		panic(err)
	}
	return d
}

// checkAgainst checks that consecutive defined boundaries are the windows
// Window returns, at their start, their last second and between.
func checkAgainst(t *testing.T, r *Rule, bounds []int64) {
	t.Helper()
	for i := 0; i+1 < len(bounds); i++ {
		b, next := bounds[i], bounds[i+1]
		for _, s := range []int64{b, (b + next) / 2, next - 1} {
			start, end := r.Window(time.Unix(s, 0))
			if start.Unix() != b || end.Unix() != next {
				t.Fatalf("%s %s at %s: got [%s, %s), want [%s, %s)", r.Location, periodName(r),
					time.Unix(s, 0).In(r.Location).Format(time.RFC3339),
					start.Format(time.RFC3339), end.Format(time.RFC3339),
					time.Unix(b, 0).In(r.Location).Format(time.RFC3339), time.Unix(next, 0).In(r.Location).Format(time.RFC3339))
			}
		}
	}
}
