package agent

import "math"

// breaker decides whether a call to the region is worth making. It opens
// after threshold failed calls in a row, so that while the region is down
// requests are decided by their failure mode at once instead of each waiting
// for a deadline; while open it lets one probe through every probeEvery, and
// the first call that succeeds closes it. It is pure (time is an argument);
// the agent guards it with a mutex.
type breaker struct {
	threshold  int
	probeEvery int64

	failures  int
	open      bool
	probing   bool
	nextProbe int64
}

// allow reports whether a call may be made at now. While the breaker is
// open it returns true once per probe interval, for the probe.
func (b *breaker) allow(now int64) bool {
	if !b.open {
		return true
	}
	if b.probing || now < b.nextProbe {
		return false
	}
	b.probing = true
	b.nextProbe = now + b.probeEvery
	return true
}

// done records the outcome of a call and reports whether the breaker
// opened or closed because of it.
func (b *breaker) done(now int64, ok bool) (opened, closed bool) {
	if ok {
		b.failures = 0
		b.probing = false
		if b.open {
			b.open = false
			return false, true
		}
		return false, false
	}
	b.failures++
	if b.open {
		b.probing = false
		b.nextProbe = now + b.probeEvery
		return false, false
	}
	if b.failures >= b.threshold {
		b.open = true
		b.nextProbe = now + b.probeEvery
		return true, false
	}
	return false, false
}

// emergency is a key's local token bucket for on_error: local once its
// leases are spent and the region cannot be reached. It runs for as long
// as the key is held: idle (no failure since the region last answered) it
// refills only up to start, one cost; in use (from the first request it
// decides until the region answers again) up to capacity. So a key's first
// request in an outage is admitted however slow its quota, and what it
// admits in any window W is at most capacity + rate × W (start + rate × W
// in a window that begins while it is idle), however often the region
// comes and goes. A key is kept in memory while its bucket holds less than
// a new one would start with (keepForEmergency).
type emergency struct {
	init   bool // tokens and last hold a state
	active bool // in use
	tokens float64
	last   int64 // agent nanos
}

// refill brings e to now at rate, up to start while idle and to capacity
// while in use. A bucket never used starts with start.
func (e *emergency) refill(now int64, rate, start, capacity float64) {
	if !e.init {
		e.init, e.tokens, e.last = true, start, now
	}
	limit := start
	if e.active {
		limit = capacity
	}
	if now > e.last {
		e.tokens = min(limit, e.tokens+float64(now-e.last)/1e9*rate)
		e.last = now
	}
}

// take admits n tokens at now from a bucket refilling at rate (tokens/s),
// or reports how long until n tokens are there. It reports activated when
// this call put the bucket in use.
func (e *emergency) take(now, n int64, rate, start, capacity float64) (ok, activated bool, wait int64) {
	e.refill(now, rate, start, capacity)
	activated = !e.active
	e.active = true
	need := float64(n)
	if e.tokens >= need {
		e.tokens -= need
		return true, activated, 0
	}
	if !(rate > 0) {
		return false, activated, -1
	}
	return false, activated, int64((need-e.tokens)/rate*1e9) + 1
}

// idle ends the bucket's use when the region answers at now: what it banked
// above start is not kept for a later failure.
func (e *emergency) idle(now int64, rate, start, capacity float64) {
	if e.active {
		e.refill(now, rate, start, capacity)
		e.active = false
		e.tokens = min(e.tokens, start)
	}
}

// full returns when, at or after now, the bucket refilling at rate holds
// target tokens (now for a bucket never used; math.MaxInt64 for never).
func (e *emergency) full(now int64, rate, target float64) int64 {
	if !e.init {
		return now
	}
	short := target - e.tokens - float64(max(now-e.last, 0))/1e9*rate
	switch {
	case short <= 0:
		return now
	case !(rate > 0):
		return math.MaxInt64
	}
	return now + int64(math.Ceil(short/rate*1e9))
}

// give puts back n tokens taken by a request that another rule denied.
func (e *emergency) give(n int64, capacity float64) {
	e.tokens = min(capacity, e.tokens+float64(n))
}
