package agent

import (
	"math"
	"sync"
	"time"
)

// spendRate is ρ̂, an exponentially weighted average of a key's demand in
// tokens per second (asked, admitted or not: demand is what a lease must
// cover). It rises fast, so that a key that becomes hot gets big leases
// within a few refreshes, and falls slowly, so that a short lull does not
// shrink leases into one round trip per request.
//
// Observations are cumulative counters, so it needs no hook on the request
// path: the refresher and the slow path observe the key's asked total when
// they size a lease.
type spendRate struct {
	at    int64   // time of the last observation, agent nanos
	asked int64   // cumulative asked tokens at that time; unobserved before the first
	rate  float32 // tokens per second
	// recent is the tokens per second asked between the key's last two
	// checks (core.check sets it): beside rate, so that the two fill a word.
	recent float32
}

// unobserved marks a spendRate's asked before its first observation (a
// flag would cost a word per key; no count of tokens reaches it).
const unobserved = math.MinInt64

// newSpendRate returns a rate that has observed nothing yet.
func newSpendRate() spendRate { return spendRate{asked: unobserved} }

// rateParams are the time constants of spendRate.
type rateParams struct {
	// window is the shortest interval a rate is measured over: a burst of
	// requests within a few microseconds must not read as millions per
	// second.
	window time.Duration
	// up and down are the averaging time constants when the measured rate
	// is above and below the estimate.
	up, down time.Duration
}

func newRateParams(leasePeriod time.Duration) rateParams {
	return rateParams{window: leasePeriod / 5, up: leasePeriod / 2, down: 20 * leasePeriod}
}

// observe folds in the demand up to now, given as the key's cumulative
// asked tokens.
func (e *spendRate) observe(now, asked int64, p rateParams) {
	if e.asked == unobserved {
		e.at, e.asked = now, asked
		return
	}
	dt := now - e.at
	if dt <= 0 {
		return
	}
	eff := max(time.Duration(dt), p.window)
	inst := float64(asked-e.asked) / eff.Seconds()
	rate := float64(e.rate)
	tau := p.down
	if inst > rate {
		tau = p.up
	}
	alpha := 1 - math.Exp(-float64(eff)/float64(tau))
	e.rate = float32(rate + alpha*(inst-rate))
	e.at, e.asked = now, asked
}

// leaseSize returns how many tokens to ask for: enough for the key's rate
// over one lease period plus the refresh lead, and at least what requests
// still waiting for the key need (waiting, beyond the asking request's
// need), clamped to [need, fair] where need is what the asking request
// must have and fair is the key's regional capacity divided among the
// region's agents, and rounded up to whole costs, because the region grants
// only whole costs.
//
// A lease grows with the rate at most to twice the previous ask (prev, 0
// for none): a burst of requests can make the rate estimate overshoot, and
// an oversized lease is mostly given back or dropped. Doubling reaches any
// size in a few round trips, which a growing key makes anyway. Requests
// that waited for the previous round trip and found its grant too small
// are demand already there, not an estimate, and are asked for at once:
// otherwise a burst on a cold key (all of a slow quota's keys are cold)
// gets one more token per round trip and mostly gives up.
func leaseSize(rate float64, period, lead time.Duration, need, waiting, cost int64, capacity float64, agents, prev int64) int64 {
	want := math.Ceil(rate * (period + lead).Seconds())
	if prev > 0 {
		want = min(want, 2*float64(prev))
	}
	want = max(want, float64(waiting))
	if capacity > 0 {
		fair := capacity / float64(max(agents, 1))
		want = min(want, fair)
	}
	want = min(want, float64(maxLeaseTokens))
	w := max(int64(want), need, cost)
	if r := w % cost; r != 0 {
		w += cost - r
	}
	return w
}

// lowWater is the balance below which a key's lease is refreshed in the
// background: what the key spends during a slow round trip plus a margin,
// and at least one cost so that taking the last whole request's tokens
// always starts a refresh.
func lowWater(rate float64, lead time.Duration, cost int64) int64 {
	return max(int64(math.Ceil(rate*lead.Seconds())), cost)
}

// rttTracker estimates the p99 round trip as the largest of the last
// len(ring) samples, which over 64 samples sits at about the 98th
// percentile and, unlike a mean, does not hide a slow tail.
type rttTracker struct {
	mu   sync.Mutex
	ring [64]time.Duration
	next int
	p99  time.Duration
}

func (r *rttTracker) record(d time.Duration) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ring[r.next] = d
	r.next = (r.next + 1) % len(r.ring)
	var m time.Duration
	for _, v := range r.ring {
		m = max(m, v)
	}
	r.p99 = m
	return m
}

func (r *rttTracker) get() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.p99
}
