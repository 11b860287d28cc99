package agent

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/ration-dev/ration/policy"
)

// Fixed windows, as the agent describes them (DESIGN.md, "Fixed windows"):
// a decision on a fixed-window rule tells the window it is in (Period, the
// window's real length; Reset, the time to its end) rather than a bucket's
// refill, and a request the window has no tokens for is told to come back
// when the window ends. The agent cuts windows with policy.Rule.Window at
// its own clock; the store cuts them at its own, so near a boundary the two
// may disagree by the clocks' skew.

// windowCache holds the window that a fixed-window rule's decisions are in,
// so that a decision costs an atomic load and two compares rather than
// Rule.Window's walk through the time zone (BenchmarkWindowCache: 1.5 ns
// against 70 ns for a day in Europe/Berlin). There is one per
// fixed-window rule of the policy in force, shared by all its keys: a
// million keys of one rule compute the window once per window, not a
// million times.
type windowCache struct {
	// w packs the window as start<<windowLenBits | length, in Unix
	// seconds (window boundaries are whole seconds); 0 before the first.
	// One word, so that no reader sees one window's start with another's
	// length.
	w atomic.Int64
}

// windowLenBits holds a window's length in seconds: up to 48 days, above a
// month's 31 days and an hour.
const windowLenBits = 22

// windowSet maps the fixed-window rules of one policy to their caches.
type windowSet struct {
	byRule map[*policy.Rule]*windowCache
}

func newWindowSet(set *policy.Set) *windowSet {
	ws := &windowSet{byRule: make(map[*policy.Rule]*windowCache)}
	for _, r := range set.Rules() {
		if r.FixedWindow() {
			ws.byRule[r] = &windowCache{}
		}
	}
	return ws
}

// at returns the window of r that contains wall (Unix nanoseconds), in Unix
// nanoseconds. A nil cache computes the window every time.
func (wc *windowCache) at(r *policy.Rule, wall int64) (start, end int64) {
	if wc != nil {
		if w := wc.w.Load(); w != 0 {
			s := (w >> windowLenBits) * 1e9
			e := s + (w&(1<<windowLenBits-1))*1e9
			if s <= wall && wall < e {
				return s, e
			}
		}
	}
	ts, te := r.Window(time.Unix(0, wall))
	s, e := ts.Unix(), te.Unix()
	// Last writer wins: decisions racing over a boundary may store the
	// window before for a moment, and the next decision computes again.
	if n := e - s; wc != nil && s > 0 && s < 1<<(63-windowLenBits) && n > 0 && n < 1<<windowLenBits {
		wc.w.Store(s<<windowLenBits | n)
	}
	return s * 1e9, e * 1e9
}

// windowOf returns the cache of fixed-window rule r in the policy in force:
// nil for a rule of a policy just replaced, whose window is then computed
// each time.
func (c *core) windowOf(r *policy.Rule) *windowCache {
	if ws := c.windows.Load(); ws != nil {
		return ws.byRule[r]
	}
	return nil
}

// windowAt returns the window of fixed-window rule r (cache wc, may be nil)
// containing agent time now, in agent time.
func (c *core) windowAt(r *policy.Rule, wc *windowCache, now int64) (start, end int64) {
	off := c.wall.Load()
	s, e := wc.at(r, now+off)
	return s - off, e - off
}

// describeWindow sets d's Period, Reset and Window for rr, a fixed-window
// rule, at now: the current window's real length (a 23- or 25-hour day
// across a DST change, a 28-day February) and the time to its end.
func (c *core) describeWindow(d *Decision, rr *ruleResult, now int64) {
	start, end := c.windowAt(rr.rule, rr.win, now)
	d.Period = time.Duration(end - start)
	d.Reset = time.Duration(end - now)
	d.Window = windowOfRule(rr.rule)
}

// denyRetry is how long a request denied at now by rr's deny cache (which
// holds until du) is told to wait. For a token bucket, until the cache
// expires: the bucket refills by then. For a fixed window, until the window
// ends: the region had no token left in it when it last answered, a window
// does not refill, and the next one is whole. Tokens may come back sooner,
// returned by other agents or given by other regions with share; the deny
// cache expires on the store's hint so that the agent asks again and
// admits them, but they are not promised, and a client told to retry in a
// second, every second, until the window ends would be told something
// false for hours.
func (c *core) denyRetry(rr *ruleResult, du, now int64) int64 {
	if !rr.fixed {
		return du - now
	}
	_, end := c.windowAt(rr.rule, rr.win, now)
	return end - now
}

// pointlessReturn reports whether tokens of fixed-window rule r given back
// at now would be dropped anyway: within a round trip's lead of the
// window's end nobody could spend them in their window (and the lease
// service drops returns within τ of a window's start, since they may be
// the window before's). They are dropped here instead, saving the call.
func (c *core) pointlessReturn(r *policy.Rule, now int64) bool {
	if r == nil || !r.FixedWindow() {
		return false
	}
	start, end := c.windowAt(r, c.windowOf(r), now)
	return now+c.lead.Load() >= end || now-start < int64(c.cfg.LeaseTTL)
}

// windowLease clips a lease size for fixed-window rule r, sent at sent,
// to what the key spends until its window ends: a lease near the end cannot
// be spent after it (the service clips its TTL there), and tokens it holds
// unspent are tokens other agents of the region were denied. The clip
// never goes below what the waiting requests need (need, waiting) nor one
// cost, and asks for at least the lead's worth, since a request sent just
// before the end may be granted from the next window.
func (c *core) windowLease(r *policy.Rule, sent, want int64, rate float64, lead time.Duration, need, waiting int64) int64 {
	_, end := c.windowAt(r, c.windowOf(r), sent)
	left := max(time.Duration(end-sent), lead)
	if left >= c.cfg.LeasePeriod+lead {
		return want
	}
	w := max(int64(math.Ceil(rate*left.Seconds())), need, waiting, r.Cost)
	if rem := w % r.Cost; rem != 0 {
		w += r.Cost - rem
	}
	return min(want, w)
}

// windowOfRule describes r's windows for a Decision; the zero Window for a
// token bucket.
func windowOfRule(r *policy.Rule) Window {
	if !r.FixedWindow() {
		return Window{}
	}
	cal := r.Calendar
	if cal == "" && r.Period == policy.NominalDay {
		cal = policy.CalendarDay // as Rule.Window treats 24h
	}
	return Window{Calendar: cal, Length: r.Period}
}
