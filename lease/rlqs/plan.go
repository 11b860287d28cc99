package rlqs

import (
	"math"
	"time"

	"github.com/ration-dev/ration/policy"
)

// This file is the deterministic core: how a bucket's demand is learned
// from reports, how its token bucket is sized, and what is pre-debited from
// the region's store before an assignment is sent. It takes now as an
// argument and does no I/O; stream.go carries its asks to the lease path
// and its actions to the proxy.

// strategy is a token bucket as assigned to a proxy, in the proxy's tokens
// (requests): max is its capacity and initial fill, perFill what one fill
// interval adds. The zero value is no token bucket.
type strategy struct{ max, perFill int64 }

// kind is what an action tells a proxy about one bucket.
type kind uint8

const (
	actNone    kind = iota // nothing to send
	actBucket              // token_bucket strategy
	actDeny                // blanket_rule DENY_ALL
	actAllow               // blanket_rule ALLOW_ALL
	actAbandon             // abandon_action
)

// action is one bucket's answer: a strategy (for actBucket) and the TTL,
// whole seconds.
type action struct {
	kind     kind
	strategy strategy
	ttl      time.Duration
}

// sizing holds the durations every assignment respects: whole seconds,
// since Envoy truncates durations to seconds.
type sizing struct {
	ttl   time.Duration // an assignment's TTL
	slack time.Duration // the longest a response takes to reach the proxy
	fill  time.Duration // fill_interval, and the tick of keep-alives
	// headroom multiplies the demand rate into the tokens per fill asked.
	headroom float64
}

// horizon is the fills pre-debited for a fresh assignment: the proxy may
// spend its refills until the TTL ends, counted from when the response
// reaches it, at most slack after it is sent.
func (z sizing) horizon() int64 { return ceilDiv(int64(z.ttl+z.slack), int64(z.fill)) }

// quota is the server's state of one bucket of one proxy stream.
type quota struct {
	id     string
	bucket map[string]string

	pol  *policy.Set  // the policy the rule was resolved in
	rule *policy.Rule // nil: no enforced rule applies (ALLOW_ALL)
	key  string       // the rule's key; StoreKey(rule.Name, key) in the store
	bad  string       // why the bucket is not served (invalid counter's label), or ""

	// Demand, learned from reports: requests (allowed + denied) and
	// allowed ones per second, and what is counted towards the next sample.
	rate, allowedRate float64
	sampled           time.Time // when the current sample began
	sumAll, sumAllow  int64
	lastActive        time.Time // the last report with a request in it
	demandCarry       float64   // fractions of a request not yet told to the exchange
	allowedCarry      float64

	// What the proxy holds: the active strategy, refills pre-debited until
	// paidUntil, and store tokens debited but not yet given (bank).
	active    strategy
	paidUntil time.Time
	bank      int64
	// regionRate is the region bucket's refill in requests per second, from
	// the last grant (0 before one): no proxy is sized above it.
	regionRate float64

	// This tick's plan: a fresh assignment or a keep-alive, its target and
	// the store tokens asked.
	fresh  bool
	target strategy
	fills  int64
	want   int64
	// The demand and allowed requests to tell the exchange with this
	// tick's ask.
	tallyDemand, tallyAllowed int64
}

// observe counts one report of the bucket received at now. Demand is
// requests over the time since the current sample began, on the server's
// clock, never less than the proxy's own time_elapsed nor than one second
// (Envoy truncates time_elapsed to whole seconds, so it may read 0 s, and
// reports at once after an assignment, a fraction of a second after its
// periodic one). A rate rises at once and falls by half per sample.
func (q *quota) observe(u usage, now time.Time) {
	n := u.allowed + u.denied
	if n > 0 {
		q.lastActive = now
	}
	q.sumAll += n
	q.sumAllow += u.allowed
	el := now.Sub(q.sampled)
	if el < time.Second && u.elapsed < time.Second {
		if q.rate == 0 && q.sumAll > 0 {
			// A new bucket's first requests: a rate to start from.
			q.rate, q.allowedRate = float64(q.sumAll), float64(q.sumAllow)
		}
		return
	}
	secs := max(el, u.elapsed, time.Second).Seconds()
	q.rate = follow(q.rate, float64(q.sumAll)/secs)
	q.allowedRate = follow(q.allowedRate, float64(q.sumAllow)/secs)
	q.sampled, q.sumAll, q.sumAllow = now, 0, 0
}

func follow(old, sample float64) float64 {
	if sample >= old {
		return sample
	}
	return old + (sample-old)/2
}

// tally returns the requests and allowed requests to tell the exchange for
// elapsed: the learned rates spread over ticks, since Envoy reports every
// five seconds and the exchange moves share every second.
func (q *quota) tally(elapsed time.Duration) (demand, allowed int64) {
	q.demandCarry += q.rate * elapsed.Seconds()
	q.allowedCarry += min(q.allowedRate, q.rate) * elapsed.Seconds()
	demand, allowed = int64(q.demandCarry), int64(q.allowedCarry)
	allowed = min(allowed, demand)
	q.demandCarry -= float64(demand)
	q.allowedCarry -= float64(allowed)
	return demand, allowed
}

// desired is the token bucket for the learned rate: tokens per fill for the
// rate with headroom (at least one), capped at the region's refill, and a
// capacity of one fill.
func (z sizing) desired(rate, regionRate float64) strategy {
	want := rate * z.headroom
	if regionRate > 0 {
		want = min(want, regionRate)
	}
	pf := max(1, int64(math.Ceil(want*z.fill.Seconds())))
	return strategy{max: pf, perFill: pf}
}

// fits reports whether the active strategy may stay for the learned rate:
// it covers the rate (or all the region gives) and is not more than half as
// large again as the desired one. Changing it costs a fresh bucket.
func (z sizing) fits(active, want strategy) bool {
	return active.perFill >= want.perFill*10/11 && active.perFill <= want.perFill*3/2+1
}

// credit moves into the bank the refills pre-debited beyond now + slack for
// a strategy being replaced: the proxy swaps strategies when the response
// reaches it, at most slack from now, and never spends the old one's
// refills after that.
func (z sizing) credit(q *quota, now time.Time, cost int64) {
	if q.active == (strategy{}) {
		return
	}
	if n := z.unspendable(q, now); n > 0 {
		q.bank += n * q.active.perFill * cost
		q.paidUntil = q.paidUntil.Add(-time.Duration(n) * z.fill)
	}
	q.active = strategy{}
}

// unspendable is the whole fills of the active strategy paid past now +
// slack.
func (z sizing) unspendable(q *quota, now time.Time) int64 {
	if q.active == (strategy{}) {
		return 0
	}
	return max(0, int64(q.paidUntil.Sub(now.Add(z.slack))/z.fill))
}

// creditable is what credit would move into the bank at now.
func (z sizing) creditable(q *quota, now time.Time, cost int64) int64 {
	return z.unspendable(q, now) * q.active.perFill * cost
}

// plan decides this tick's ask for a bucket with a rule: a keep-alive of
// the active strategy (the next fills until now + ttl + slack) or a fresh
// one (its capacity and refills over the horizon), less the bank. It sets
// q.want in store tokens (a multiple of nothing: the store grants partly).
func (z sizing) plan(q *quota, now time.Time) {
	cost := q.rule.Cost
	q.target = z.desired(q.rate, q.regionRate)
	if q.active != (strategy{}) && z.fits(q.active, q.target) {
		q.fresh = false
		q.fills = max(0, ceilDiv(int64(now.Add(z.ttl+z.slack).Sub(q.paidUntil)), int64(z.fill)))
		q.want = max(0, q.fills*q.active.perFill*cost-q.bank)
	} else {
		// The old strategy's refills past now + slack will pay for part of
		// the new one (credited in settle, once the new one is sent).
		q.fresh = true
		q.want = max(0, z.need(q.target, cost)-q.bank-z.creditable(q, now, cost))
	}
	if q.want > 0 {
		q.want = max(q.want, cost)
	}
}

// need is the store tokens a fresh strategy pre-debits: its initial fill and
// its refills over the horizon.
func (z sizing) need(s strategy, cost int64) int64 {
	return (s.max + s.perFill*z.horizon()) * cost
}

// settle takes the tokens the store granted for this tick's ask and returns
// the action to send. A keep-alive extends the TTL as far as the refills
// paid reach; when they reach less than a second it refits, as does a fresh
// plan: the target if the bank pays for it, else the largest bucket it pays
// for, else DENY_ALL (the region grants nothing now).
func (z sizing) settle(q *quota, now time.Time, granted int64) action {
	cost := q.rule.Cost
	q.bank += granted
	if !q.fresh {
		per := q.active.perFill * cost
		n := min(q.bank/per, q.fills)
		q.bank -= n * per
		q.paidUntil = q.paidUntil.Add(time.Duration(n) * z.fill)
		ttl := min(z.ttl, q.paidUntil.Sub(now.Add(z.slack)).Truncate(time.Second))
		if ttl >= time.Second {
			return action{kind: actBucket, strategy: q.active, ttl: ttl}
		}
	}
	z.credit(q, now, cost)
	s := q.target
	if q.bank < z.need(s, cost) {
		pf := q.bank / cost / (1 + z.horizon())
		s = strategy{max: pf, perFill: pf}
	}
	if s.perFill < 1 {
		return action{kind: actDeny, ttl: z.ttl}
	}
	q.bank -= z.need(s, cost)
	q.active = s
	q.paidUntil = now.Add(time.Duration(z.horizon()) * z.fill)
	return action{kind: actBucket, strategy: s, ttl: z.ttl}
}

// failed is the action when the store could not be asked: a rule that
// fails closed denies, one that fails open allows, and a local one lets the
// assignment run out, after which the proxy's expired_assignment_behavior
// applies. Nothing was debited, so the bank and the refills paid stand.
func (z sizing) failed(q *quota) action {
	switch q.rule.OnError {
	case policy.OnErrorClosed:
		z.drop(q)
		return action{kind: actDeny, ttl: z.ttl}
	case policy.OnErrorOpen:
		z.drop(q)
		return action{kind: actAllow, ttl: z.ttl}
	}
	return action{}
}

// drop forgets the active strategy (a blanket rule replaced it): its
// refills already paid are simply not spent.
func (z sizing) drop(q *quota) { q.active = strategy{} }

func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}
