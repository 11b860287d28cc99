package agent

import (
	"math"
	"time"

	"github.com/ration-dev/ration/policy"
)

type action uint8

const (
	actNone action = iota
	actRefresh
)

// planRefresh is one wake-up of the refresher at now, short of its calls:
// it takes the keys queued below low water and those whose check is due,
// checks each (adding tokens to give back to rets), adds the probe key
// while the region is unreachable, and returns the policy in force and the
// keys to renew, which renewBatch turns into calls. When the region may
// not be called it returns none, and checks them again after the probe
// interval. work is space for the keys taken, returned emptied as spare for
// the next wake-up.
func (c *core) planRefresh(now int64, work []*keyState, rets *returnBatch) (pol *policy.Set, renew, spare []*keyState) {
	c.qmu.Lock()
	work = append(work, c.queue...)
	clear(c.queue)
	c.queue = reuse(c.queue)
	c.qmu.Unlock()
	work = c.popDue(now, work)
	pol = c.pol.Load()
	for _, k := range work {
		if c.check(k, pol, now, rets) == actRefresh {
			renew = append(renew, k)
		}
	}
	clear(work)
	if c.down.Load() && len(renew) == 0 {
		if k := c.probeKey.Load(); k != nil && !k.isEvicted() {
			renew = append(renew, k)
		}
	}
	if len(renew) > 0 {
		if call, _ := c.mayCall(now); !call {
			for _, k := range renew {
				c.scheduleBy(k, now+int64(c.cfg.ProbeInterval))
			}
			renew = nil
		}
	}
	c.smu.Lock()
	scheduled := len(c.sched)
	c.smu.Unlock()
	// The next wake-up takes at most the keys scheduled now and those
	// queued meanwhile: room for many more is memory of evicted keys.
	return pol, renew, reuse(work[:min(len(work), scheduled)])
}

// reuse returns s emptied for reuse, or nil when its array is far larger
// than s (after a burst of many keys), to give it back.
func reuse(s []*keyState) []*keyState {
	if cap(s) > max(4*len(s), 1024) {
		return nil
	}
	return s[:0]
}

// renewBatch makes the next background flight out of keys, the front of a
// renew list from planRefresh: the keys whose rule still exists and which
// have no round trip in flight, up to maxBatch of them, each asking for one
// cost. It returns the flight (nil when none of the keys it went through
// needed one; while the region is down that releases the probe) and the
// keys it has not gone through yet.
func (c *core) renewBatch(pol *policy.Set, keys []*keyState) (f *flight, rest []*keyState) {
	used := 0
	for _, k := range keys {
		used++
		r := pol.Rule(k.rule())
		k.mu.Lock()
		if r != nil && k.flight == nil && !k.isEvicted() {
			if f == nil {
				f = &flight{done: make(chan struct{})}
			}
			k.flight = f
			f.keys = append(f.keys, k)
			f.rules = append(f.rules, r)
			f.needs = append(f.needs, r.Cost)
		}
		k.mu.Unlock()
		if f != nil && len(f.keys) == maxBatch {
			break
		}
	}
	if f != nil {
		c.ctr.refreshCalls.Add(1)
		c.ctr.refreshItems.Add(int64(len(f.keys)))
	} else if c.down.Load() {
		c.releaseProbe()
	}
	return f, keys[used:]
}

// check decides what k needs at now: a renewed lease, its unused tokens
// returned, eviction, or nothing until a later check, which it schedules.
// Tokens to return are added to rets.
func (c *core) check(k *keyState, pol *policy.Set, now int64, rets *returnBatch) action {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.isEvicted() {
		return actNone
	}
	c.dropLocked(k, k.collect(now))
	active := false
	asked := k.askedLocked()
	if dt := now - k.checkedAt; dt > 0 {
		k.rate.recent = float32(float64(asked-k.checkedAsked) / (float64(dt) / 1e9))
	}
	if asked != k.checkedAsked {
		k.lastActive, active = max(k.lastActive, now), true
	}
	k.checkedAsked, k.checkedAt = asked, now
	switch {
	case k.flight != nil:
		return actNone // its completion schedules the next check
	case pol.Rule(k.rule()) == nil:
		c.evictLocked(k, now, rets) // the rule is gone
		return actNone
	case active || k.flags.has(flagQueued):
		return c.checkActive(k, pol.Rule(k.rule()), now, rets)
	case now-k.lastActive >= int64(c.cfg.IdleAfter):
		if at := c.keepForEmergency(k, pol.Rule(k.rule()), now); at > now && at < math.MaxInt64 {
			c.scheduleAt(k, at)
			return actNone
		}
		c.evictLocked(k, now, rets)
		return actNone
	}
	if live := k.liveTokens(now); live > 0 {
		if renewAt := k.firstExpiry(now) - c.renewLead(); now+int64(c.tick()) < renewAt {
			c.scheduleAt(k, renewAt)
			return actNone
		}
		horizon := now + c.renewLead() + int64(c.tick())
		if lasting := k.liveTokens(horizon); lasting > 0 {
			// Unused since the last check, which may have been a moment
			// ago: only the leases about to expire give back, as an active
			// key's do, and a later one is checked before it expires.
			c.returnSurplusLocked(k, pol.Rule(k.rule()), now, horizon, lasting, rets)
			c.scheduleAt(k, k.firstExpiry(horizon)-c.renewLead())
			return actNone
		}
		// Unused since the last check and about to expire: give the
		// tokens back while someone can still spend them (at the end of
		// a fixed window nobody can: they stay, and expire).
		if r := pol.Rule(k.rule()); !c.pointlessReturn(r, now) {
			live, dropped := k.drain(now)
			c.dropLocked(k, dropped)
			c.giveBackLocked(k, r, now, live, rets)
		}
	}
	c.scheduleAt(k, k.lastActive+int64(c.cfg.IdleAfter))
	return actNone
}

// checkActive handles a key that saw requests since its last check, or
// whose balance fell below its low-water mark. It is renewed when the
// tokens that will still be spendable after the next round trip and tick
// (the horizon) fall below the low-water mark, unless the deny cache says
// to wait; otherwise its next check is planned.
func (c *core) checkActive(k *keyState, r *policy.Rule, now int64, rets *returnBatch) action {
	live := k.liveTokens(now)
	horizon := now + c.renewLead() + int64(c.tick())
	lasting := k.liveTokens(horizon)
	if k.flags.has(flagQueued) && lasting >= int64(k.lowWater.Load()) {
		k.flags.set(flagQueued, false) // the other slot still holds enough
	}
	switch {
	case k.flags.has(flagQueued):
	case live > 0 && lasting < int64(k.lowWater.Load()):
		// A lease is about to expire. What the key will not spend before
		// then goes back to the region instead of being dropped, and the
		// key is renewed only if it is still spending.
		c.returnSurplusLocked(k, r, now, horizon, lasting, rets)
		if float64(k.rate.recent)*c.cfg.LeaseTTL.Seconds() < float64(r.Cost) {
			next := k.lastActive + int64(c.cfg.IdleAfter)
			if lasting > 0 {
				// A later lease still holds tokens: check it before it expires.
				next = min(next, k.firstExpiry(horizon)-c.renewLead())
			}
			c.scheduleAt(k, next)
			return actNone
		}
	case live > 0:
		// The lease expiring first, if it does before the horizon, gives
		// back what the key will not spend from it.
		c.returnSurplusLocked(k, r, now, horizon, lasting, rets)
		c.scheduleAt(k, k.firstExpiry(horizon)-c.renewLead())
		return actNone
	default:
		// No lease, no low-water signal: demand that was denied or decided
		// by a failure mode. The next request asks for itself.
		c.scheduleAt(k, k.lastActive+int64(c.cfg.IdleAfter))
		return actNone
	}
	if du := k.denyUntil.Load(); now < du {
		c.scheduleAt(k, du)
		return actNone
	}
	return actRefresh
}

// returnSurplusLocked returns the tokens of leases expiring before horizon
// beyond what the key, at its recent rate, will spend until they expire.
// lasting is what the key holds beyond the horizon.
//
// A token dropped at expiry is lost to the quota until the region refills
// it: milliseconds for a per-second quota, minutes for a daily one. A
// Return costs a store operation and holds up the refresher for a round
// trip. So the key keeps for its spending at most its spare (what its
// region refills in a lease TTL: nothing, for a slow quota), and while a
// later lease still holds tokens, an expiring lease gives back only a
// surplus larger than the spare: a per-second quota lets a few tokens
// expire rather than delay its next refresh, and a slow one gives every
// token back. Where a fixed window's tokens cannot go back usefully
// (pointlessReturn), they stay for the key to spend until they expire.
func (c *core) returnSurplusLocked(k *keyState, r *policy.Rule, now, horizon, lasting int64, rets *returnBatch) {
	if c.pointlessReturn(r, now) {
		return
	}
	spare := c.spareLocked(k)
	floor := int64(0)
	if lasting > 0 {
		floor = spare
	}
	for i := range k.slots.word {
		exp := k.slots.exp[i].Load()
		if exp <= now || exp > horizon {
			continue
		}
		use := min(int64(math.Ceil(float64(k.rate.recent)*float64(exp-now)/1e9)), spare)
		if surplus := balance(k.slots.word[i].Load()) - use; surplus > floor {
			n := k.slots.takeUpTo(i, surplus)
			c.giveBackLocked(k, r, now, n, rets)
		}
	}
}

// spareLocked is how many tokens k may let expire unspent: what its region
// refills in a lease TTL, so that a drop costs no more than the lease term
// of the bound already counts.
func (c *core) spareLocked(k *keyState) int64 {
	return int64(float64(k.regionRate) * float64(k.ttl))
}

// keepForEmergency returns until when an idle key must stay in memory for
// its emergency bucket (now when it may go): until the bucket holds what a
// new one would start with, since forgetting it sooner would let a new one
// start over (DESIGN.md, "Failure modes"); and while the region is
// unreachable and the bucket in use, until it is full, so that the bursts
// of a slow quota can use the rate banked between them. A bucket that never
// refills (a share of 0) does not keep its key.
func (c *core) keepForEmergency(k *keyState, r *policy.Rule, now int64) int64 {
	e := k.fallback()
	if r == nil || e == nil || !e.init {
		return now
	}
	rate, start, capacity := c.emergencyParams(k, r, r.Cost)
	target := start
	if e.active && c.down.Load() {
		target = capacity
	}
	return e.full(now, rate, target)
}

// evictLocked forgets k, returning its live tokens.
func (c *core) evictLocked(k *keyState, now int64, rets *returnBatch) {
	k.flags.set(flagEvicted, true)
	live, dropped := k.drain(now)
	c.dropLocked(k, dropped)
	c.giveBackLocked(k, c.pol.Load().Rule(k.rule()), now, live, rets)
	c.unschedule(k)
	c.keys.remove(k)
	c.ctr.evicted.Add(1)
}

// giveBackLocked returns n tokens that left k's leases at now to the
// region, or counts them dropped where returning them is pointless (at the
// end of a fixed window).
func (c *core) giveBackLocked(k *keyState, r *policy.Rule, now, n int64, rets *returnBatch) {
	if c.pointlessReturn(r, now) {
		c.dropLocked(k, n)
		return
	}
	k.net -= n
	rets.add(k, n)
}

// renewLead is how long before a lease expires the refresher acts on it:
// a round trip's lead plus one tick, since checks run on the tick.
func (c *core) renewLead() int64 { return c.lead.Load() + int64(c.tick()) }

func (c *core) tick() time.Duration { return max(c.cfg.LeasePeriod/5, time.Millisecond) }
