package policy

import (
	"math"
	"time"
)

// How a fixed-window rule cuts time into windows. Every window boundary is
// a whole Unix second: periods are whole seconds, and so are the offsets
// and transitions of the time zone database.
//
// Windows follow the wall clock of the rule's Location:
//
//   - A calendar window (day, week, month; and 24h, which is day) starts at
//     the first instant the local calendar shows its first date: local
//     midnight, or, where the clock jumps over midnight, the instant of the
//     jump. A day is 23 or 25 hours long across a DST change; a day the
//     clock skips entirely (Pacific/Apia, 2011-12-30) has no window; when the
//     clock is set back over midnight, the repeated hour belongs to the new
//     date's window, since that date had already begun.
//   - A sub-day window of period d starts whenever the local clock reaches a
//     multiple of d counted from local midnight: by running onto it, by
//     being set forward onto or past it, or by being set back onto it. So a
//     skipped hour has no window of its own (spring forward: 01:00–03:00 is
//     one hour of real time, and one hourly window), and a repeated hour
//     has two (fall back in Berlin: 02:00 CEST and 02:00 CET each start a
//     window of one real hour). A window into which the clock is set back
//     without landing on a multiple is longer by the change (Lord Howe's
//     30-minute fall back makes its 01:00 hourly window 90 minutes).
//
// Sub-day windows therefore nest in days, and days in weeks and months:
// every boundary of a longer period is a boundary of each shorter one.

// Nominal lengths of the calendar periods: Rule.Period for them, and what
// Rate divides the limit by.
const (
	NominalDay  = 24 * time.Hour
	NominalWeek = 7 * NominalDay
	// NominalMonth is the mean Gregorian month, 365.2425 days / 12, so that
	// twelve months of Rate make a year's limit.
	NominalMonth = 2_629_746 * time.Second
)

// The domain of the window arithmetic: years 1 to 9999. Times outside it
// are treated as its nearest end, which keeps the arithmetic far from
// overflow (and Boundaries' microseconds within int64).
const (
	minWindowUnix = -62135596800 // 0001-01-01T00:00:00Z
	maxWindowUnix = 253402300799 // 9999-12-31T23:59:59Z
)

const secondsPerDay = 86400

// Window returns the window of a fixed-window rule that contains t:
// start <= t < end, in the rule's Location. Window(start) is the same
// window and Window(end) the next one; windows neither overlap nor leave
// gaps. For t before year 1 or after year 9999 it returns the window of
// that range's nearest end.
//
// Window does not allocate. It panics on a token-bucket rule, which has no
// windows (check FixedWindow first).
func (r *Rule) Window(t time.Time) (start, end time.Time) {
	loc := r.location()
	s, e := r.window(loc, t.Unix())
	return time.Unix(s, 0).In(loc), time.Unix(e, 0).In(loc)
}

// Boundaries returns, in Unix microseconds, the start of the window before
// the one containing t, that window's start and end, and the end of the
// window after it: four boundaries spanning three windows, so that a store
// whose clock differs from t's can pick the window its own clock falls in.
// Like Window it panics on a token-bucket rule.
func (r *Rule) Boundaries(t time.Time) [4]int64 {
	loc := r.location()
	s, e := r.window(loc, t.Unix())
	prev, _ := r.window(loc, s-1)
	_, next := r.window(loc, e)
	return [4]int64{prev * 1e6, s * 1e6, e * 1e6, next * 1e6}
}

// location returns the rule's time zone; nil (a Rule built by hand) is UTC.
func (r *Rule) location() *time.Location {
	if r.Location == nil {
		return time.UTC
	}
	return r.Location
}

// window returns the window containing Unix second s, as Unix seconds.
func (r *Rule) window(loc *time.Location, s int64) (start, end int64) {
	if !r.FixedWindow() {
		panic("policy: Window of rule " + r.Name + ", a token bucket, which has no windows")
	}
	s = min(max(s, minWindowUnix), maxWindowUnix)
	cal := r.Calendar
	if cal == "" && r.Period == 24*time.Hour {
		cal = CalendarDay
	}
	if cal != "" {
		return calendarWindow(loc, cal, s)
	}
	d := max(int64(r.Period/time.Second), 1)
	return prevTick(loc, d, s), nextTick(loc, d, s)
}

// zone returns the UTC offset in effect at Unix second s and the span
// [start, end) over which it holds; MinInt64 and MaxInt64 stand for a span
// without a start or an end.
func zone(loc *time.Location, s int64) (offset, start, end int64) {
	t := time.Unix(s, 0).In(loc)
	_, off := t.Zone()
	zs, ze := t.ZoneBounds()
	start, end = math.MinInt64, math.MaxInt64
	if !zs.IsZero() {
		start = min(zs.Unix(), s) // min and max keep the callers' walks moving
	}
	if !ze.IsZero() {
		end = max(ze.Unix(), s+1)
	}
	return int64(off), start, end
}

// prevTick returns the latest boundary of d-second windows at or before s.
// Within one zone span the wall clock runs evenly, so the last multiple of
// d it showed is one division away; before the span's start, the change of
// offset there may itself start a window, and if not, the walk goes on in
// the span before.
func prevTick(loc *time.Location, d, s int64) int64 {
	for {
		off, zs, _ := zone(loc, s)
		if c := floorDiv(s+off, d)*d - off; c >= zs {
			return c
		}
		before, _, _ := zone(loc, zs-1)
		if tickAtChange(zs, before, off, d) {
			return zs
		}
		s = zs - 1
	}
}

// nextTick returns the earliest boundary of d-second windows after s.
func nextTick(loc *time.Location, d, s int64) int64 {
	for {
		off, _, ze := zone(loc, s)
		if c := floorDiv(s+off, d)*d + d - off; c < ze {
			return c
		}
		after, _, _ := zone(loc, ze)
		if tickAtChange(ze, off, after, d) {
			return ze
		}
		s = ze
	}
}

// tickAtChange reports whether a change of offset from before to after at
// Unix second at starts a d-second window: the clock lands on a multiple of
// d, or is set forward over one.
func tickAtChange(at, before, after, d int64) bool {
	from, to := at+before, at+after
	return floorDiv(to, d)*d >= min(from, to)
}

// calendarWindow returns the calendar window containing Unix second s. A
// window runs from the first instant of its first date to the first instant
// of the next window's; when the clock was set back over midnight, s may
// show a date whose successor has already begun, and then s belongs to the
// successor's window.
func calendarWindow(loc *time.Location, cal Calendar, s int64) (start, end int64) {
	off, _, _ := zone(loc, s)
	day := floorDiv(s+off, secondsPerDay) // local days since 1970-01-01
	from := day
	switch cal {
	case CalendarWeek:
		from = day - floorMod(day+3, 7) // 1970-01-01 was a Thursday
	case CalendarMonth:
		y, m, _ := time.Unix(day*secondsPerDay, 0).UTC().Date()
		from = time.Date(y, m, 1, 0, 0, 0, 0, time.UTC).Unix() / secondsPerDay
	}
	start = firstAt(loc, from*secondsPerDay)
	for {
		to := nextCalendarDay(cal, from)
		end = firstAt(loc, to*secondsPerDay)
		if s < end {
			return start, end
		}
		from, start = to, end
	}
}

// nextCalendarDay returns the first day of the window after the one that
// starts on day from (days since 1970-01-01).
func nextCalendarDay(cal Calendar, from int64) int64 {
	switch cal {
	case CalendarWeek:
		return from + 7
	case CalendarMonth:
		y, m, _ := time.Unix(from*secondsPerDay, 0).UTC().Date()
		return time.Date(y, m+1, 1, 0, 0, 0, 0, time.UTC).Unix() / secondsPerDay
	}
	return from + 1
}

// firstAt returns the first Unix second at which the local wall clock shows
// wall (seconds since 1970-01-01 00:00 local) or later. It walks the zone
// spans forward from two days before, when the clock surely showed less
// (no offset in the database is near 48 hours).
func firstAt(loc *time.Location, wall int64) int64 {
	s := wall - 2*secondsPerDay
	for {
		off, _, ze := zone(loc, s)
		if s+off >= wall { // the clock was set forward over wall at s
			return s
		}
		if c := wall - off; c < ze {
			return c
		}
		s = ze
	}
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func floorMod(a, b int64) int64 { return a - floorDiv(a, b)*b }
