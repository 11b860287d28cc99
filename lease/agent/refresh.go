package agent

import (
	"container/heap"
	"context"
	"math"
	"time"

	"github.com/ration-dev/ration/policy"
)

// The refresher is the goroutine that keeps leases ahead of demand. It
// wakes when a spend leaves a key below its low-water mark, and on a tick
// for keys whose scheduled check is due (a lease about to expire, a key
// that may have gone idle). All the keys that need a lease at one wake-up
// go in one Lease call, and one call is in flight at a time.

func (a *Agent) refreshLoop() {
	defer a.wg.Done()
	tick := time.NewTicker(a.tick())
	defer tick.Stop()
	var work []*keyState
	for {
		select {
		case <-a.ctx.Done():
			return
		case <-a.wake:
		case <-tick.C:
		}
		work = a.refreshOnce(work[:0])
	}
}

type action uint8

const (
	actNone action = iota
	actRefresh
)

// refreshOnce handles the queued and due keys at the current time.
func (a *Agent) refreshOnce(work []*keyState) []*keyState {
	now := a.now()
	var rets returnBatch
	pol, renew, work := a.planRefresh(now, work, &rets)
	for len(renew) > 0 {
		var f *flight
		if f, renew = a.renewBatch(pol, renew); f != nil {
			a.leaseCall(f, a.cfg.RefreshTimeout)
		}
	}
	if len(rets.items) > 0 {
		ctx, cancel := context.WithTimeout(a.calls, a.cfg.RefreshTimeout)
		a.sendReturns(ctx, &rets)
		cancel()
	}
	return work
}

// planRefresh is one wake-up of the refresher at now, short of its calls:
// it takes the keys queued below low water and those whose check is due,
// checks each (adding tokens to give back to rets), adds the probe key
// while the region is unreachable, and returns the policy in force and the
// keys to renew, which renewBatch turns into calls. When the region may
// not be called it returns none, and checks them again after the probe
// interval. work is space for the keys taken, returned emptied as spare for
// the next wake-up. The refresher and the simulator's Driver both plan
// through it.
func (a *Agent) planRefresh(now int64, work []*keyState, rets *returnBatch) (pol *policy.Set, renew, spare []*keyState) {
	a.qmu.Lock()
	work = append(work, a.queue...)
	clear(a.queue)
	a.queue = a.queue[:0]
	a.qmu.Unlock()
	work = a.popDue(now, work)
	pol = a.pol.Load()
	for _, k := range work {
		if a.check(k, pol, now, rets) == actRefresh {
			renew = append(renew, k)
		}
	}
	clear(work)
	if a.down.Load() && len(renew) == 0 {
		if k := a.probeKey.Load(); k != nil && !k.isEvicted() {
			renew = append(renew, k)
		}
	}
	if len(renew) > 0 {
		if call, _ := a.mayCall(now); !call {
			for _, k := range renew {
				a.scheduleBy(k, now+int64(a.cfg.ProbeInterval))
			}
			renew = nil
		}
	}
	return pol, renew, work[:0]
}

// renewBatch makes the next background flight out of keys, the front of a
// renew list from planRefresh: the keys whose rule still exists and which
// have no round trip in flight, up to maxBatch of them, each asking for one
// cost. It returns the flight (nil when none of the keys it went through
// needed one; while the region is down that releases the probe) and the
// keys it has not gone through yet.
func (a *Agent) renewBatch(pol *policy.Set, keys []*keyState) (f *flight, rest []*keyState) {
	used := 0
	for _, k := range keys {
		used++
		r := pol.Rule(k.rule)
		k.mu.Lock()
		if r != nil && k.flight == nil && !k.evicted.Load() {
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
		a.ctr.refreshCalls.Add(1)
		a.ctr.refreshItems.Add(int64(len(f.keys)))
	} else if a.down.Load() {
		a.releaseProbe()
	}
	return f, keys[used:]
}

// check decides what k needs at now: a renewed lease, its unused tokens
// returned, eviction, or nothing until a later check, which it schedules.
// Tokens to return are added to rets.
func (a *Agent) check(k *keyState, pol *policy.Set, now int64, rets *returnBatch) action {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.evicted.Load() {
		return actNone
	}
	a.dropLocked(k, k.collect(now))
	active := false
	asked := k.askedLocked()
	if dt := now - k.checkedAt; dt > 0 {
		k.recentRate = float64(asked-k.checkedAsked) / (float64(dt) / 1e9)
	}
	if asked != k.checkedAsked {
		k.lastActive, active = max(k.lastActive, now), true
	}
	k.checkedAsked, k.checkedAt = asked, now
	switch {
	case k.flight != nil:
		return actNone // its completion schedules the next check
	case pol.Rule(k.rule) == nil:
		a.evictLocked(k, now, rets) // the rule is gone
		return actNone
	case active || k.queued.Load():
		return a.checkActive(k, pol.Rule(k.rule), now, rets)
	case now-k.lastActive >= int64(a.cfg.IdleAfter):
		a.evictLocked(k, now, rets)
		return actNone
	}
	if live := k.liveTokens(now); live > 0 {
		if renewAt := k.firstExpiry(now) - a.renewLead(); now+int64(a.tick()) < renewAt {
			a.scheduleAt(k, renewAt)
			return actNone
		}
		// Unused since the last check and about to expire: give the
		// tokens back while someone can still spend them.
		live, dropped := k.drain(now)
		a.dropLocked(k, dropped)
		k.returned += live
		rets.add(k, live)
	}
	a.scheduleAt(k, k.lastActive+int64(a.cfg.IdleAfter))
	return actNone
}

// checkActive handles a key that saw requests since its last check, or
// whose balance fell below its low-water mark. It is renewed when the
// tokens that will still be spendable after the next round trip and tick
// (the horizon) fall below the low-water mark, unless the deny cache says
// to wait; otherwise its next check is planned.
func (a *Agent) checkActive(k *keyState, r *policy.Rule, now int64, rets *returnBatch) action {
	live := k.liveTokens(now)
	horizon := now + a.renewLead() + int64(a.tick())
	lasting := k.liveTokens(horizon)
	if k.queued.Load() && lasting >= k.lowWater.Load() {
		k.queued.Store(false) // the other slot still holds enough
	}
	switch {
	case k.queued.Load():
	case live > 0 && lasting < k.lowWater.Load():
		// A lease is about to expire. What the key will not spend before
		// then goes back to the region instead of being dropped, and the
		// key is renewed only if it is still spending.
		a.returnSurplusLocked(k, now, horizon, rets)
		if k.recentRate*a.cfg.LeaseTTL.Seconds() < float64(r.Cost) {
			a.scheduleAt(k, k.lastActive+int64(a.cfg.IdleAfter))
			return actNone
		}
	case live > 0:
		a.scheduleAt(k, k.firstExpiry(horizon)-a.renewLead())
		return actNone
	default:
		// No lease, no low-water signal: demand that was denied or decided
		// by a failure mode. The next request asks for itself.
		a.scheduleAt(k, k.lastActive+int64(a.cfg.IdleAfter))
		return actNone
	}
	if du := k.denyUntil.Load(); now < du {
		a.scheduleAt(k, du)
		return actNone
	}
	return actRefresh
}

// returnSurplusLocked returns the tokens of leases expiring before horizon
// beyond what the key, at its recent rate, will spend until they expire.
func (a *Agent) returnSurplusLocked(k *keyState, now, horizon int64, rets *returnBatch) {
	for i := range k.slots.word {
		exp := k.slots.exp[i].Load()
		if exp <= now || exp > horizon {
			continue
		}
		use := int64(math.Ceil(k.recentRate * float64(exp-now) / 1e9))
		if surplus := balance(k.slots.word[i].Load()) - use; surplus > 0 {
			n := k.slots.takeUpTo(i, surplus)
			k.returned += n
			rets.add(k, n)
		}
	}
}

// evictLocked forgets k, returning its live tokens.
func (a *Agent) evictLocked(k *keyState, now int64, rets *returnBatch) {
	k.evicted.Store(true)
	live, dropped := k.drain(now)
	a.dropLocked(k, dropped)
	k.returned += live
	rets.add(k, live)
	a.unschedule(k)
	a.keys.remove(k)
	a.ctr.evicted.Add(1)
}

// renewLead is how long before a lease expires the refresher acts on it:
// a round trip's lead plus one tick, since checks run on the tick.
func (a *Agent) renewLead() int64 { return a.lead.Load() + int64(a.tick()) }

func (a *Agent) tick() time.Duration { return max(a.cfg.LeasePeriod/5, time.Millisecond) }

// schedule is a min-heap of keys by due time, guarded by Agent.smu.
type schedule []*keyState

func (s schedule) Len() int           { return len(s) }
func (s schedule) Less(i, j int) bool { return s[i].due < s[j].due }
func (s schedule) Swap(i, j int) {
	s[i], s[j] = s[j], s[i]
	s[i].heapIdx, s[j].heapIdx = i, j
}
func (s *schedule) Push(x any) {
	k := x.(*keyState)
	k.heapIdx = len(*s)
	*s = append(*s, k)
}
func (s *schedule) Pop() any {
	old := *s
	k := old[len(old)-1]
	old[len(old)-1] = nil
	*s = old[:len(old)-1]
	k.heapIdx = -1
	return k
}

// scheduleAt sets k's next check to at, replacing any earlier plan.
func (a *Agent) scheduleAt(k *keyState, at int64) {
	a.smu.Lock()
	k.due = at
	if k.heapIdx >= 0 {
		heap.Fix(&a.sched, k.heapIdx)
	} else {
		heap.Push(&a.sched, k)
	}
	a.smu.Unlock()
}

// scheduleBy makes sure k is checked by at, keeping an earlier plan.
func (a *Agent) scheduleBy(k *keyState, at int64) {
	a.smu.Lock()
	if k.heapIdx < 0 {
		k.due = at
		heap.Push(&a.sched, k)
	} else if at < k.due {
		k.due = at
		heap.Fix(&a.sched, k.heapIdx)
	}
	a.smu.Unlock()
}

func (a *Agent) unschedule(k *keyState) {
	a.smu.Lock()
	if k.heapIdx >= 0 {
		heap.Remove(&a.sched, k.heapIdx)
	}
	a.smu.Unlock()
}

// popDue appends the keys due at now to dst, removing them from the heap.
func (a *Agent) popDue(now int64, dst []*keyState) []*keyState {
	a.smu.Lock()
	defer a.smu.Unlock()
	for len(a.sched) > 0 && a.sched[0].due <= now {
		dst = append(dst, heap.Pop(&a.sched).(*keyState))
	}
	return dst
}
