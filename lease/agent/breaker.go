package agent

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
// leases are spent and the region cannot be reached. It starts empty when
// activated, so that what it admits over an outage of length D is at most
// rate × D: the held leases and the emergency rate are the whole excess.
type emergency struct {
	active bool
	tokens float64
	last   int64 // agent nanos
}

// take admits n tokens at now from a bucket refilling at rate (tokens/s)
// up to capacity, or reports how long until n tokens are there. It reports
// activated when this call switched the bucket on.
func (e *emergency) take(now, n int64, rate, capacity float64) (ok, activated bool, wait int64) {
	if !e.active {
		e.active, e.tokens, e.last, activated = true, 0, now, true
	}
	if now > e.last {
		e.tokens = min(capacity, e.tokens+float64(now-e.last)/1e9*rate)
		e.last = now
	}
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

// give puts back n tokens taken by a request that another rule denied.
func (e *emergency) give(n int64, capacity float64) {
	e.tokens = min(capacity, e.tokens+float64(n))
}
