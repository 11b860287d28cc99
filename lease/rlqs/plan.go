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

// sizing holds what every assignment respects. The TTL and fill interval
// are whole seconds, since Envoy truncates durations to seconds; slack is
// the server's own accounting and may be a fraction.
type sizing struct {
	ttl   time.Duration // an assignment's TTL
	slack time.Duration // the longest a response takes to reach the proxy
	fill  time.Duration // fill_interval
	// headroom multiplies the demand rate into the rate asked; when this
	// server's buckets of a key ask for more than the region's refill, each
	// gets its part of use (below 1, so that a little refill is left for
	// keep-alives that come late and for saving towards larger buckets).
	headroom, use float64
}

// refill is the store tokens a strategy's refills over d cost, rounded up:
// Envoy refills continuously, tokens_per_fill per fill_interval.
func (z sizing) refill(s strategy, d time.Duration, cost int64) int64 {
	if d <= 0 {
		return 0
	}
	return int64(math.Ceil(float64(s.perFill)*float64(d)/float64(z.fill))) * cost
}

// covers is how long n store tokens of refills last for strategy s.
func (z sizing) covers(s strategy, n, cost int64) time.Duration {
	return time.Duration(float64(n/cost) * float64(z.fill) / float64(s.perFill))
}

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
	reported          time.Time // the last report
	// What the exchange is told: the requests reported, as they were.
	tellAll, tellAllowed teller

	// What the proxy holds: the active strategy, refills pre-debited until
	// paidUntil, and store tokens debited but not yet given (bank).
	active    strategy
	paidUntil time.Time
	bank      int64
	// regionRate is the region bucket's refill in requests per second, from
	// the last grant (0 before one): no proxy is sized above it.
	regionRate float64
	// spare is the store tokens the region's bucket held after the last
	// grant: what an upsize may take at once without taking a refill that
	// other buckets' keep-alives need.
	spare float64
	// storeKey and counted: the key's sum in the server's fair, and this
	// bucket's part of it.
	storeKey string
	counted  float64

	// This tick's plan: a fresh assignment or a keep-alive, its target and
	// the store tokens asked.
	fresh  bool
	upsize bool // saving for a larger target while keeping the active one
	target strategy
	extend int64 // store tokens of the keep-alive's refills
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
// periodic one). A rate rises at once and falls by half per sample: it
// sizes the proxy's token bucket. The exchange is told the requests
// themselves (teller), not this rate, whose fall by halves and rise at once
// would overstate a noisy demand and hold a fallen one for samples.
func (q *quota) observe(u usage, now time.Time) {
	n := u.allowed + u.denied
	if n > 0 {
		q.lastActive = now
	}
	gap := now.Sub(q.reported)
	q.reported = now
	q.tellAll.add(n)
	q.tellAllowed.add(u.allowed)
	if gap >= time.Second/2 || q.tellAll.rate == 0 {
		// What is pending is told by about the next report, taken to come
		// as long after this one as this one after the last; a report a
		// moment after another leaves the pace as it was.
		span := max(gap, u.elapsed, time.Second)
		q.tellAll.pace(span)
		q.tellAllowed.pace(span)
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

// teller tells the exchange a count the proxy reports (its requests, or
// its allowed ones): reported requests wait in pending and are told at
// rate per second over the keep-alive ticks, since Envoy reports every
// five seconds and the exchange moves share every second. Summed, the
// exchange hears exactly the requests reported, about one report interval
// after they were seen, with no bias and no smoothing of its own (the
// exchange smooths and adds noise headroom itself).
type teller struct {
	pending float64 // reported, not yet told
	rate    float64 // per second
	carry   float64 // told, a fraction of a request not yet in an item
}

func (t *teller) add(n int64) { t.pending += float64(n) }

// pace tells what is pending over span from now on.
func (t *teller) pace(span time.Duration) { t.rate = t.pending / span.Seconds() }

// take is the whole requests to tell for elapsed.
func (t *teller) take(elapsed time.Duration) int64 {
	x := min(t.pending, t.rate*elapsed.Seconds())
	t.pending -= x
	t.carry += x
	n := int64(t.carry + 1e-9) // float error must not hold back a request
	t.carry = max(0, t.carry-float64(n))
	return n
}

// untake puts n requests back to be told later.
func (t *teller) untake(n int64) { t.pending += float64(n) }

func follow(old, sample float64) float64 {
	if sample >= old {
		return sample
	}
	return old + (sample-old)/2
}

// tally returns the requests and allowed requests to tell the exchange for
// elapsed (teller): never more allowed than requests in one tally.
func (q *quota) tally(elapsed time.Duration) (demand, allowed int64) {
	demand, allowed = q.tellAll.take(elapsed), q.tellAllowed.take(elapsed)
	if allowed > demand {
		q.tellAllowed.untake(allowed - demand)
		allowed = demand
	}
	return demand, allowed
}

// desired is the token bucket for the learned rate: tokens per fill for the
// rate with headroom (at least one), capped at the bucket's part of the
// region's refill, and a capacity of half a fill (Envoy refills
// continuously, so the capacity only bounds a burst, and it is pre-debited
// whole with every fresh bucket). The part is use times the region's rate
// in proportion to this bucket's demand among all this server's buckets of
// the key (keyRate, their sum), when they ask for more than it.
func (z sizing) desired(rate, regionRate, keyRate float64) (s strategy, tight bool) {
	want := rate * z.headroom
	if regionRate > 0 {
		want = min(want, regionRate*z.use)
		if keyRate*z.headroom > regionRate && keyRate > 0 {
			want = min(want, z.use*regionRate*rate/keyRate)
			tight = true
		}
	}
	// Less a hair, so that float error does not round 110.00000000000001 up.
	pf := max(1, int64(math.Ceil(want*z.fill.Seconds()-1e-9)))
	return strategy{max: max(1, (pf+1)/2), perFill: pf}, tight
}

// fits reports whether the active strategy may stay for the target: no
// more than a tenth below it, and no more than half as large again, or a
// fifth when the region is tight (its buckets ask for more than its
// refill), where a bucket larger than its part takes refill that another
// bucket's keep-alive needs. Changing it costs a fresh bucket.
func (z sizing) fits(active, want strategy, tight bool) bool {
	upper := want.perFill*3/2 + 1
	if tight {
		upper = want.perFill*6/5 + 1
	}
	return active.perFill >= want.perFill*9/10 && active.perFill <= upper
}

// credit moves into the bank the refills pre-debited beyond now + slack for
// a strategy being replaced: the proxy swaps strategies when the response
// reaches it, at most slack from now, and never spends the old one's
// refills after that.
func (z sizing) credit(q *quota, now time.Time, cost int64) {
	if q.active == (strategy{}) {
		return
	}
	if n := z.creditable(q, now, cost); n > 0 {
		q.bank += n
		q.paidUntil = q.paidUntil.Add(-z.covers(q.active, n, cost))
	}
	q.active = strategy{}
}

// creditable is the store tokens of the active strategy's refills paid
// past now + slack, rounded down.
func (z sizing) creditable(q *quota, now time.Time, cost int64) int64 {
	d := q.paidUntil.Sub(now.Add(z.slack))
	if q.active == (strategy{}) || d <= 0 {
		return 0
	}
	return int64(float64(q.active.perFill)*float64(d)/float64(z.fill)) * cost
}

// plan decides this tick's ask for a bucket with a rule. A strategy that
// fits the target is kept alive: its refills until now + ttl + slack. A
// larger target is saved for while the active strategy is kept alive (a
// fresh bucket costs its capacity and whole horizon at once, and the
// region refills only a tick's worth per tick): the difference's refill
// for the tick, or as much of what is missing as the region's bucket held
// beyond the refill at the last grant. A smaller target, or none active,
// is fresh. The bank and the old strategy's refills past now + slack pay
// first. It sets q.want in store tokens.
func (z sizing) plan(q *quota, now time.Time, tick time.Duration, keyRate float64) {
	cost := q.rule.Cost
	var tight bool
	q.target, tight = z.desired(q.rate, q.regionRate, keyRate)
	q.upsize = false
	switch {
	case q.active != (strategy{}) && (z.fits(q.active, q.target, tight) || q.target.perFill > q.active.perFill):
		q.fresh = false
		q.extend = z.refill(q.active, now.Add(z.ttl+z.slack).Sub(q.paidUntil), cost)
		q.want = max(0, q.extend-q.bank)
		if !z.fits(q.active, q.target, tight) {
			q.upsize = true
			missing := max(0, z.need(q.target, cost)-z.creditable(q, now, cost)-max(0, q.bank-q.extend))
			diff := z.refill(strategy{perFill: q.target.perFill - q.active.perFill}, tick, cost)
			q.want += min(missing, max(diff, int64(q.spare)))
		}
	default:
		q.fresh = true
		q.want = max(0, z.need(q.target, cost)-q.bank-z.creditable(q, now, cost))
	}
	if q.want > 0 {
		q.want = max(q.want, cost)
	}
}

// need is the store tokens a fresh strategy pre-debits: its capacity, the
// initial fill, and its refills until the TTL ends, counted from when the
// response reaches the proxy, at most slack after it is sent.
func (z sizing) need(s strategy, cost int64) int64 {
	return s.max*cost + z.refill(s, z.ttl+z.slack, cost)
}

// settle takes the tokens the store granted for this tick's ask and returns
// the action to send. A keep-alive extends the TTL as far as the refills
// paid reach; when they reach less than a second it refits, as does a fresh
// plan and an upsize whose savings suffice: the target if the bank pays
// for it, else the largest bucket it pays for, else DENY_ALL (the region
// grants nothing now).
func (z sizing) settle(q *quota, now time.Time, granted int64) action {
	cost := q.rule.Cost
	q.bank += granted
	if !q.fresh {
		n := min(q.bank, q.extend)
		n -= n % cost
		q.bank -= n
		q.paidUntil = q.paidUntil.Add(z.covers(q.active, n, cost))
		ttl := min(z.ttl, q.paidUntil.Sub(now.Add(z.slack)).Truncate(time.Second))
		if ttl >= time.Second && !(q.upsize && q.bank+z.creditable(q, now, cost) >= z.need(q.target, cost)) {
			return action{kind: actBucket, strategy: q.active, ttl: ttl}
		}
	}
	z.credit(q, now, cost)
	s := q.target
	if q.bank < z.need(s, cost) {
		// The largest bucket the bank pays for: max + perFill·h ≤ bank,
		// with max = perFill/2 and h the horizon in fills.
		h := float64(z.ttl+z.slack) / float64(z.fill)
		pf := int64(float64(q.bank/cost) / (h + 0.5))
		for pf > 0 && z.need(strategy{max: max(1, (pf+1)/2), perFill: pf}, cost) > q.bank {
			pf--
		}
		s = strategy{max: max(1, (pf+1)/2), perFill: pf}
	}
	if s.perFill < 1 {
		return action{kind: actDeny, ttl: z.ttl}
	}
	q.bank -= z.need(s, cost)
	q.active = s
	q.paidUntil = now.Add(z.covers(s, z.refill(s, z.ttl+z.slack, cost), cost))
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
