package agent

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ration-dev/ration/lease/service"
	leasev1 "github.com/ration-dev/ration/lease/v1"
	"github.com/ration-dev/ration/policy"
)

// decideAt decides one request of tenant at at, waiting for its round trip
// when it needs one, and returns the decision and when it was made.
func (w *driverWorld) decideAt(at time.Duration) (Decision, time.Duration) {
	w.t.Helper()
	w.advance(at)
	w.tag++
	if d, ok := w.d.Decide(at, tenant, 1, w.tag); ok {
		w.send(w.d.Poll(at))
		return d, at
	}
	w.send(w.d.Poll(at))
	for step := at + w.rtt; step <= at+time.Second; step += w.rtt {
		w.advance(step)
		if d, ok := w.tags[w.tag]; ok {
			return d, w.at[w.tag]
		}
	}
	w.t.Fatalf("the request at %v was not decided within a second", at)
	return Decision{}, 0
}

func mustZone(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// windowCheck is what a decision at an instant should say about its window.
type windowCheck struct {
	allowed bool
	end     time.Time     // the end of the window the decision is in
	period  time.Duration // that window's real length
}

// TestFixedWindowDecisions runs fixed windows of a minute, an hour, a day
// and a month (in UTC and across DST changes in Europe/Berlin) on a virtual
// clock: every decision's Period is the current window's real length and
// its Reset the time to the window's end; a denial's RetryAfter is the
// time to the window's end too, not the store's hint (at most an hour),
// also when the agent asks the region again after that hint; the next
// window admits again.
func TestFixedWindowDecisions(t *testing.T) {
	berlin := mustZone(t, "Europe/Berlin")
	utc := func(s string) time.Time {
		tm, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	for _, tt := range []struct {
		name   string
		rule   string
		window Window
		start  time.Time
		// Requests at these offsets from start, one cost each.
		at   []time.Duration
		want []windowCheck
	}{{
		name:   "minute",
		rule:   "period: 1m",
		window: Window{Length: time.Minute},
		start:  utc("2026-01-15T12:00:10Z"),
		at:     []time.Duration{0, time.Second, 2 * time.Second, 3 * time.Second, 4 * time.Second, 50 * time.Second},
		want: []windowCheck{
			{true, utc("2026-01-15T12:01:00Z"), time.Minute},
			{true, utc("2026-01-15T12:01:00Z"), time.Minute},
			{true, utc("2026-01-15T12:01:00Z"), time.Minute},
			{false, utc("2026-01-15T12:01:00Z"), time.Minute},
			{false, utc("2026-01-15T12:01:00Z"), time.Minute},
			{true, utc("2026-01-15T12:02:00Z"), time.Minute},
		},
	}, {
		// 02:00 CEST and 02:00 CET each start an hour of their own.
		name:   "hour, Berlin, the repeated hour",
		rule:   "period: 1h, time_zone: Europe/Berlin",
		window: Window{Length: time.Hour},
		start:  utc("2026-10-25T00:30:00Z"), // 02:30 CEST
		at:     []time.Duration{0, time.Minute, 2 * time.Minute, 3 * time.Minute, time.Hour},
		want: []windowCheck{
			{true, utc("2026-10-25T01:00:00Z"), time.Hour},
			{true, utc("2026-10-25T01:00:00Z"), time.Hour},
			{true, utc("2026-10-25T01:00:00Z"), time.Hour},
			{false, utc("2026-10-25T01:00:00Z"), time.Hour},
			{true, utc("2026-10-25T02:00:00Z"), time.Hour}, // 02:30 CET
		},
	}, {
		// Berlin falls back on 2026-10-25: the day lasts 25 hours. The
		// denials come 12 hours before its end, past the store's hint of
		// at most an hour, and the agent asks again after that hint.
		name:   "day, Berlin, 25 hours",
		rule:   "period: day, time_zone: Europe/Berlin",
		window: Window{Calendar: policy.CalendarDay, Length: 24 * time.Hour},
		start:  utc("2026-10-25T11:00:00Z"), // 12:00 CET
		at:     []time.Duration{0, time.Second, 2 * time.Second, 3 * time.Second, 3*time.Second + time.Millisecond, 65 * time.Minute, 12*time.Hour + time.Second},
		want: []windowCheck{
			{true, utc("2026-10-25T23:00:00Z"), 25 * time.Hour},
			{true, utc("2026-10-25T23:00:00Z"), 25 * time.Hour},
			{true, utc("2026-10-25T23:00:00Z"), 25 * time.Hour},
			{false, utc("2026-10-25T23:00:00Z"), 25 * time.Hour},
			{false, utc("2026-10-25T23:00:00Z"), 25 * time.Hour},
			{false, utc("2026-10-25T23:00:00Z"), 25 * time.Hour},
			{true, utc("2026-10-26T23:00:00Z"), 24 * time.Hour},
		},
	}, {
		// Berlin springs forward on 2026-03-29: 23 hours.
		name:   "24h, Berlin, 23 hours",
		rule:   "period: 24h, time_zone: Europe/Berlin",
		window: Window{Calendar: policy.CalendarDay, Length: 24 * time.Hour},
		start:  utc("2026-03-29T21:59:58Z"),
		at:     []time.Duration{0, time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond, 2 * time.Second},
		want: []windowCheck{
			{true, utc("2026-03-29T22:00:00Z"), 23 * time.Hour},
			{true, utc("2026-03-29T22:00:00Z"), 23 * time.Hour},
			{true, utc("2026-03-29T22:00:00Z"), 23 * time.Hour},
			{false, utc("2026-03-29T22:00:00Z"), 23 * time.Hour},
			{true, utc("2026-03-30T22:00:00Z"), 24 * time.Hour},
		},
	}, {
		// The week Berlin springs forward: Monday to Monday, 167 hours.
		name:   "week, Berlin, 167 hours",
		rule:   "period: week, time_zone: Europe/Berlin",
		window: Window{Calendar: policy.CalendarWeek, Length: policy.NominalWeek},
		start:  utc("2026-03-25T12:00:00Z"), // a Wednesday
		at:     []time.Duration{0, time.Second, 2 * time.Second, 3 * time.Second, 106 * time.Hour},
		want: []windowCheck{
			{true, utc("2026-03-29T22:00:00Z"), 167 * time.Hour},
			{true, utc("2026-03-29T22:00:00Z"), 167 * time.Hour},
			{true, utc("2026-03-29T22:00:00Z"), 167 * time.Hour},
			{false, utc("2026-03-29T22:00:00Z"), 167 * time.Hour},
			{true, utc("2026-04-05T22:00:00Z"), 168 * time.Hour},
		},
	}, {
		name:   "month, February",
		rule:   "period: month",
		window: Window{Calendar: policy.CalendarMonth, Length: policy.NominalMonth},
		start:  utc("2026-02-20T00:00:00Z"),
		at:     []time.Duration{0, time.Hour, 2 * time.Hour, 3 * time.Hour, 9 * 24 * time.Hour},
		want: []windowCheck{
			{true, utc("2026-03-01T00:00:00Z"), 28 * 24 * time.Hour},
			{true, utc("2026-03-01T00:00:00Z"), 28 * 24 * time.Hour},
			{true, utc("2026-03-01T00:00:00Z"), 28 * 24 * time.Hour},
			{false, utc("2026-03-01T00:00:00Z"), 28 * 24 * time.Hour},
			{true, utc("2026-04-01T00:00:00Z"), 31 * 24 * time.Hour},
		},
	}, {
		// March in Berlin is an hour short: 31 days less the skipped hour.
		name:   "month, Berlin, March",
		rule:   "period: month, time_zone: Europe/Berlin",
		window: Window{Calendar: policy.CalendarMonth, Length: policy.NominalMonth},
		start:  utc("2026-03-31T21:00:00Z"),
		at:     []time.Duration{0, time.Second, 2 * time.Second, 3 * time.Second, time.Hour},
		want: []windowCheck{
			{true, utc("2026-03-31T22:00:00Z"), 31*24*time.Hour - time.Hour},
			{true, utc("2026-03-31T22:00:00Z"), 31*24*time.Hour - time.Hour},
			{true, utc("2026-03-31T22:00:00Z"), 31*24*time.Hour - time.Hour},
			{false, utc("2026-03-31T22:00:00Z"), 31*24*time.Hour - time.Hour},
			{true, utc("2026-04-30T22:00:00Z"), 30 * 24 * time.Hour},
		},
	}} {
		t.Run(tt.name, func(t *testing.T) {
			rule := fmt.Sprintf("rules:\n  - {name: r, key: [tenant], limit: 3, algorithm: fixed_window, %s}\n", tt.rule)
			w := newDriverWorldAt(t, rule, time.Millisecond, tt.start, service.Config{}, Config{})
			for i, at := range tt.at {
				got, when := w.decideAt(at)
				c := tt.want[i]
				left := c.end.Sub(tt.start.Add(when))
				want := Decision{Allowed: c.allowed, Limit: 3, Period: c.period, Window: tt.window, Reset: left, Rule: "r", Path: got.Path}
				if !c.allowed {
					want.RetryAfter = left
				}
				if diff := cmp.Diff(want, got, cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Remaining" }, cmp.Ignore())); diff != "" {
					t.Errorf("request %d at %v (%s) (-want +got):\n%s", i, at, tt.start.Add(at).In(berlin).Format(time.RFC3339), diff)
				}
			}
		})
	}
}

// TestFixedWindowLeasesStayInTheirWindow runs fixed windows under demand
// near or above their limit, steady or in bursts at each window's start, on
// several agents: no window admits more than its limit (a lease spent past
// its window's end would add the window before's tokens to the next one's),
// the agents admit nearly all of it, leases asked just before a window's
// end are sized to what is left of it, and no tokens go back where the
// service would drop them (within a round trip of a window's end, or τ of
// its start). The refresher's ticks fall 2ms before each second, so that
// some checks come just before a window's end.
func TestFixedWindowLeasesStayInTheirWindow(t *testing.T) {
	const perSecond = "{name: r, key: [tenant], limit: 1000, period: 1s, algorithm: fixed_window}"
	for _, tt := range []struct {
		name   string
		rule   string
		agents int
		window time.Duration
		times  []time.Duration
		least  float64 // of the limit admitted in every whole window
	}{
		{"1000 per 1s window, 4 agents, 2000 req/s", perSecond, 4, time.Second, every(0, 500*time.Microsecond, 10000), 0.97},
		{"1000 per 1s window, 4 agents, 1000 req/s", perSecond, 4, time.Second, every(0, time.Millisecond, 10000), 0.97},
		{"1000 per 1s window, 4 agents, 900 req/s", perSecond, 4, time.Second, every(0, time.Second/900, 9000), 0.9},
		{"1000 per 1s window, 4 agents, bursts of 300 in 30ms at its start", perSecond, 4, time.Second, bursts(2*time.Millisecond, time.Second, 100*time.Microsecond, 300, 10), 0.3},
		{"100 per 1m window, 4 agents, 10 req/s", "{name: r, key: [tenant], limit: 100, period: 1m, algorithm: fixed_window}", 4, time.Minute, every(0, 100*time.Millisecond, 3000), 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := newQuotaWorldAt(t, tt.rule, tt.agents, Config{}, time.Unix(1_700_000_000, 998_000_000))
			end := tt.times[len(tt.times)-1] + time.Millisecond
			w.run(tt.times, roundRobin(tt.agents), end)
			t.Log(w.summary(0))
			// Windows are whole multiples of tt.window in Unix time.
			first := w.start.Truncate(tt.window)
			windowOf := func(at time.Duration) int { return int(w.start.Add(at).Sub(first) / tt.window) }
			perWindow := map[int]int64{}
			for _, at := range w.res.admittedAt {
				perWindow[windowOf(at)]++
			}
			last := windowOf(end)
			for i := 0; i <= last; i++ {
				n := perWindow[i]
				if n > w.rule.Limit {
					t.Errorf("window %d admitted %d, more than its limit %d", i, n, w.rule.Limit)
				}
				if whole := i > 0 && i < last; whole && float64(n) < tt.least*float64(w.rule.Limit) {
					t.Errorf("window %d admitted %d, want at least %.0f%% of %d", i, n, 100*tt.least, w.rule.Limit)
				}
			}
			// How far into its window, and how long before its end, a
			// return is sent or a lease asked.
			place := func(at time.Duration) (since, to time.Duration) {
				wall := w.start.Add(at)
				s := wall.Truncate(tt.window)
				return wall.Sub(s), s.Add(tt.window).Sub(wall)
			}
			for _, at := range w.res.returnsAt {
				if since, to := place(at); to < 3*time.Millisecond || since < 2*DefaultLeasePeriod {
					t.Errorf("a return at %v, %v into its window and %v before its end: pointless", at, since, to)
				}
			}
			typical := median(w.res.wants)
			for i, at := range w.res.wantsAt {
				if _, to := place(at); to < 20*time.Millisecond && w.res.wants[i] > max(typical/2, 1) {
					t.Errorf("a lease of %d asked %v before its window's end; the median lease is %d", w.res.wants[i], to, typical)
				}
			}
		})
	}
}

// TestFixedWindowRetryAfterIsTheWindowsEnd exhausts a daily window while
// the service caps its retry hints at a sync period (as it does while an
// exchange moves shares): every denial tells the client the window's end,
// hours away, while the agent asks the region again on the service's hint,
// about once a second, so that a token given back by another agent is
// admitted within about a second of arriving.
func TestFixedWindowRetryAfterIsTheWindowsEnd(t *testing.T) {
	start, _ := time.Parse(time.RFC3339, "2026-01-15T10:00:00Z")
	end := start.Add(14 * time.Hour)
	w := newDriverWorldAt(t, "rules:\n  - {name: r, key: [tenant], limit: 3, period: day, algorithm: fixed_window}\n",
		time.Millisecond, start, service.Config{ShareRetryAfter: time.Second}, Config{})
	for i := range 3 {
		if d, _ := w.decideAt(time.Duration(i) * time.Millisecond); !d.Allowed {
			t.Fatalf("request %d denied, want the window's 3 admitted", i)
		}
	}
	denied := func(from, to time.Duration) (admittedAt time.Duration) {
		t.Helper()
		for at := from; at < to; at += 100 * time.Millisecond {
			d, when := w.decideAt(at)
			if d.Allowed {
				return when
			}
			if want := end.Sub(start.Add(when)); d.RetryAfter != want || d.Reset != want {
				t.Fatalf("denial at %v: RetryAfter %v and Reset %v, want the window's end in %v", when, d.RetryAfter, d.Reset, want)
			}
		}
		return -1
	}
	calls := w.d.Stats().LeaseCalls
	if at := denied(time.Second, 6*time.Second); at >= 0 {
		t.Fatalf("admitted at %v in an exhausted window", at)
	}
	if n := w.d.Stats().LeaseCalls - calls; n < 4 || n > 6 {
		t.Errorf("%d lease calls in 5s of denials, want one about every second (the service's hint)", n)
	}
	// Another agent gives a token back.
	w.advance(6*time.Second + 50*time.Millisecond)
	ret := &leasev1.ReturnRequest{Agent: &leasev1.Agent{Id: "a2"}, Items: []*leasev1.ReturnItem{{Rule: "r", Key: "tenant=acme", Tokens: 1}}}
	if _, err := w.svc.Return(context.Background(), ret); err != nil {
		t.Fatal(err)
	}
	at := denied(6*time.Second+100*time.Millisecond, 8*time.Second)
	if at < 0 || at > 7*time.Second+150*time.Millisecond {
		t.Errorf("the token given back at 6.05s was admitted at %v, want within about a second", at)
	}
	if at := denied(at+100*time.Millisecond, 9*time.Second); at >= 0 {
		t.Errorf("admitted again at %v, want denials until the window's end", at)
	}
}

// TestFixedWindowLeaseEndsWithItsWindow leases tokens 50ms before a
// window's end over a round trip of 20ms: the service clips the lease's TTL
// at the window's end as its clock sees it when it grants, and the agent
// measures the TTL from when it sent the request, so the lease expires at
// the window's end, not a round trip after it; a decision just after the
// end asks the region (and gets the next window's tokens) rather than
// spending the window before's.
func TestFixedWindowLeaseEndsWithItsWindow(t *testing.T) {
	start, _ := time.Parse(time.RFC3339Nano, "2026-01-15T12:00:59.95Z")
	w := newDriverWorldAt(t, "rules:\n  - {name: r, key: [tenant], limit: 1000, period: 1m, algorithm: fixed_window}\n",
		20*time.Millisecond, start, service.Config{}, Config{RoundTripTimeout: 100 * time.Millisecond})
	if d, at := w.decideAt(0); !d.Allowed || at != 20*time.Millisecond {
		t.Fatalf("got %+v at %v, want admitted after the round trip", d, at)
	}
	k := w.d.c.keys.get([]byte("r\x00tenant=acme"))
	end := int64(50 * time.Millisecond) // 12:01:00, in agent time
	for i := range k.slots.exp {
		if exp := k.slots.exp[i].Load(); exp > end {
			t.Errorf("slot %d expires at %v, after the window's end at %v", i, time.Duration(exp), time.Duration(end))
		}
	}
	w.advance(55 * time.Millisecond)
	if k.liveTokens(int64(55*time.Millisecond)) != 0 {
		t.Errorf("%d tokens of the window before still live after its end", k.liveTokens(int64(55*time.Millisecond)))
	}
	d, at := w.decideAt(55 * time.Millisecond)
	if want := time.Minute - (at - 50*time.Millisecond); !d.Allowed || d.Reset != want {
		t.Errorf("after the window's end got %+v, want admitted with the next window's Reset %v", d, want)
	}
}

// TestFixedWindowDenyCacheEndsWithItsWindow denies a request of two hits
// 5ms before a window's end when the window has one token left: the deny
// cache would hold for part of a lease period, into the next window, which
// is whole; it ends with the window instead, so that a request just after
// the end is admitted.
func TestFixedWindowDenyCacheEndsWithItsWindow(t *testing.T) {
	start, _ := time.Parse(time.RFC3339, "2026-01-15T12:00:50Z")
	w := newDriverWorldAt(t, "rules:\n  - {name: r, key: [tenant], limit: 3, period: 1m, algorithm: fixed_window}\n",
		time.Millisecond, start, service.Config{}, Config{})
	for i := range 2 {
		if d, _ := w.decideAt(time.Duration(i) * time.Second); !d.Allowed {
			t.Fatalf("request %d denied", i)
		}
	}
	at := 10*time.Second - 5*time.Millisecond
	w.advance(at)
	w.tag++
	if _, ok := w.d.Decide(at, tenant, 2, w.tag); ok {
		t.Fatal("decided without a round trip")
	}
	w.send(w.d.Poll(at))
	w.advance(at + 2*time.Millisecond)
	if d, ok := w.tags[w.tag]; !ok || d.Allowed {
		t.Fatalf("two hits with one token left: got %+v (decided %v), want a denial", d, ok)
	}
	d, when := w.decideAt(10*time.Second + time.Millisecond)
	if !d.Allowed {
		t.Errorf("a request at %v, just after the window's end, got %+v: the deny cache outlived its window", when, d)
	}
}

// TestAgentFixedWindowOnTheWallClock decides a daily window with an Agent
// on its default clock (monotonic, anchored to the wall clock): Reset is
// the time to the next UTC midnight.
func TestAgentFixedWindowOnTheWallClock(t *testing.T) {
	r := startLeaseServer(t, "rules:\n  - {name: r, key: [tenant], limit: 10, period: day, algorithm: fixed_window}\n", nil)
	a := newAgent(t, r, Config{RoundTripTimeout: time.Second})
	before := time.Now()
	d := a.Allow(context.Background(), tenant, 1)
	after := time.Now()
	end := before.UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)
	if !after.Before(end) {
		t.Skip("the decision straddled midnight")
	}
	if !d.Allowed || d.Period != 24*time.Hour || d.Reset > end.Sub(before) || d.Reset < end.Sub(after)-time.Millisecond {
		t.Errorf("got %+v, want admitted with Period 24h and Reset in [%v, %v]", d, end.Sub(after), end.Sub(before))
	}
}
