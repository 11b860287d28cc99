package agent

import (
	"context"
	"time"

	"github.com/ration-dev/ration/policy"
)

// maxAttempts bounds the round trips one request makes: after a grant,
// other requests may take the tokens first (a cold key's first leases are
// small and grow by doubling), so a request tries again within its
// deadline, up to this many times, before it gives up.
const maxAttempts = 8

// slowPath decides the rules that decideLocal could not: keys without
// tokens and without a deny cache entry. Each attempt makes one round trip
// for all of them (joining a round trip already in flight for a key, so
// that one key never has two); the request waits at most RoundTripTimeout
// in all, and each rule's failure mode decides when the region cannot
// answer in time. It returns the time after the wait.
//
// What is decided is slowAttempt's and slowSettle's, which the simulator's
// Driver runs too; this function only sends the call and waits.
func (a *Agent) slowPath(ctx context.Context, s *scratch, now int64) int64 {
	wctx, cancel := context.WithTimeout(ctx, a.cfg.RoundTripTimeout)
	defer cancel()
	for n := 0; ; n++ {
		own, decided := a.slowAttempt(s, n, now)
		if decided {
			return now
		}
		if own != nil {
			a.leaseCall(own, a.cfg.RoundTripTimeout)
		}
	wait:
		for i := range s.res {
			if rr := &s.res[i]; !rr.done && rr.f != nil {
				select {
				case <-rr.f.done:
				case <-wctx.Done():
					break wait
				}
			}
		}
		now = a.now()
		if a.slowSettle(s, now, wctx.Err() != nil) {
			return now
		}
	}
}

// slowAttempt starts attempt n (from 0) of the slow path at now. It reports
// decided when there is nothing to ask the region: every rule is decided,
// the attempts are used up (giveUp), live tokens split across slots covered
// the rest, or the region may not be called (each undecided rule's failure
// mode decides). Otherwise every undecided rule waits for its key's round
// trip (ruleResult.f), and own, when not nil, is a new flight of this
// request for the caller to send.
func (a *Agent) slowAttempt(s *scratch, n int, now int64) (own *flight, decided bool) {
	if !a.pendingRules(s) {
		return nil, true
	}
	if n >= maxAttempts {
		a.giveUp(s)
		return nil, true
	}
	if a.fromSplitLeases(s, now) && !a.pendingRules(s) {
		return nil, true
	}
	call, probe := a.mayCall(now)
	if !call {
		for i := range s.res {
			if rr := &s.res[i]; !rr.done {
				a.ensureKey(s, rr, now)
				a.failMode(rr, now)
			}
		}
		return nil, true
	}
	s.synced = true
	own = a.joinOrStart(s, now)
	if own == nil && probe {
		a.releaseProbe()
	}
	return own, false
}

// slowSettle continues the slow path at now, once the round trips of the
// last attempt are done or the wait for them ended; expired reports that
// the request's deadline has passed. Each waiting rule is decided by its
// round trip: no answer in time or an error decides by the failure mode,
// tokens granted are spent, and a grant too small while the deny cache
// holds is a denial. It reports decided when no further attempt is needed:
// a round trip did not answer in time (what is left is denied), the
// deadline has passed (what is left goes to its failure mode: another
// round would find the deadline gone at once), a rule was denied, or every
// rule is decided.
func (a *Agent) slowSettle(s *scratch, now int64, expired bool) (decided bool) {
	timedOut := false
	for i := range s.res {
		rr := &s.res[i]
		if rr.done {
			continue
		}
		f := rr.f
		rr.f = nil
		if f == nil || !flightDone(f) {
			timedOut = true
			a.failMode(rr, now) // the region did not answer in time
			continue
		}
		if f.err != nil {
			a.failMode(rr, now)
			continue
		}
		if j, w, ok := a.take(rr.k, s.stripeIdx, now, rr.need); ok {
			rr.leased(j, w)
			continue
		}
		if du := rr.k.denyUntil.Load(); now < du {
			// The region just granted too little: a denial on the lease
			// path; later requests meet the deny cache.
			rr.done, rr.path, rr.retry = true, PathLease, du-now
			rr.k.denied.Add(rr.need)
			if !rr.rule.Shadow {
				return true
			}
		}
	}
	if timedOut {
		a.giveUp(s)
		return true
	}
	if expired {
		for i := range s.res {
			if rr := &s.res[i]; !rr.done {
				a.failMode(rr, now)
			}
		}
		return true
	}
	return !a.pendingRules(s)
}

// giveUp denies what is still undecided after every attempt: the tokens
// granted went to other requests each time.
func (a *Agent) giveUp(s *scratch) {
	for i := range s.res {
		if rr := &s.res[i]; !rr.done {
			rr.done, rr.path, rr.retry = true, PathLease, int64(time.Millisecond)
			rr.k.denied.Add(rr.need)
		}
	}
}

// fromSplitLeases serves undecided rules whose keys hold enough live
// tokens in total but not in any one slot or stripe entry, by gathering
// them into one slot first. It reports whether it decided any.
func (a *Agent) fromSplitLeases(s *scratch, now int64) bool {
	any := false
	for i := range s.res {
		rr := &s.res[i]
		if rr.done || rr.k == nil || rr.k.liveTokens(now) < rr.need {
			continue
		}
		rr.k.mu.Lock()
		a.dropLocked(rr.k, rr.k.consolidateLocked(now))
		rr.k.mu.Unlock()
		if j, w, ok := a.take(rr.k, s.stripeIdx, now, rr.need); ok {
			rr.leased(j, w)
			any = true
		}
	}
	return any
}

// ensureKey gives rr a live key state, creating one for a new key. A new
// key is scheduled for an idle check, so that keys which never get a lease
// (decided by failure modes, say) are still forgotten once idle.
func (a *Agent) ensureKey(s *scratch, rr *ruleResult, now int64) {
	if rr.k != nil && !rr.k.isEvicted() {
		return
	}
	nameLen, created := rr.nameLen, false
	rr.k = a.keys.getOrCreate(s.buf[rr.start:rr.end], func(id string) *keyState {
		created = true
		return newKeyState(id, nameLen, now)
	})
	if created {
		a.scheduleAt(rr.k, now+int64(a.cfg.IdleAfter))
	}
}

func (a *Agent) pendingRules(s *scratch) bool {
	for i := range s.res {
		if !s.res[i].done {
			return true
		}
	}
	return false
}

// joinOrStart makes every undecided rule wait for a round trip of its key:
// the key's flight in progress, or a new flight of this request, returned
// for the caller to run.
func (a *Agent) joinOrStart(s *scratch, now int64) *flight {
	var own *flight
	for i := range s.res {
		rr := &s.res[i]
		if rr.done {
			continue
		}
		for {
			a.ensureKey(s, rr, now)
			k := rr.k
			k.mu.Lock()
			if k.evicted.Load() {
				k.mu.Unlock()
				continue
			}
			k.lastActive = now
			if k.flight == nil {
				if own == nil {
					own = &flight{done: make(chan struct{})}
				}
				k.flight = own
				own.keys = append(own.keys, k)
				own.rules = append(own.rules, rr.rule)
				own.needs = append(own.needs, rr.need)
			}
			rr.f = k.flight
			k.mu.Unlock()
			break
		}
	}
	return own
}

// mayCall reports whether the region may be called now: the breaker is
// closed, or it is open and this call is its probe.
func (a *Agent) mayCall(now int64) (call, probe bool) {
	if a.closed.Load() {
		return false, false
	}
	if !a.down.Load() {
		return true, false
	}
	a.bmu.Lock()
	defer a.bmu.Unlock()
	call = a.br.allow(now)
	return call, call && a.br.open
}

func (a *Agent) releaseProbe() {
	a.bmu.Lock()
	a.br.probing = false
	a.bmu.Unlock()
}

// callDone feeds a round trip's outcome to the breaker.
func (a *Agent) callDone(now int64, ok bool) {
	a.bmu.Lock()
	opened, closed := a.br.done(now, ok)
	if opened || closed {
		a.down.Store(a.br.open)
	}
	a.bmu.Unlock()
	if opened {
		a.ctr.breakerOpened.Add(1)
		a.cfg.Logger.Warn("region unreachable: deciding by each rule's failure mode", "target", a.cfg.Target)
	}
	if closed {
		a.cfg.Logger.Info("region reachable again")
	}
}

// failMode decides a rule by its on_error, for a key that needs the region
// while the region cannot be reached (DESIGN.md, "Failure modes").
func (a *Agent) failMode(rr *ruleResult, now int64) {
	rr.done = true
	k := rr.k
	a.probeKey.Store(k)
	switch rr.rule.OnError {
	case policy.OnErrorOpen:
		rr.ok, rr.path, rr.undo = true, PathFailedOpen, undoExtra
		k.extra.Add(rr.need)
	case policy.OnErrorClosed:
		rr.path, rr.retry = PathFailedClosed, int64(a.cfg.ProbeInterval)
		k.denied.Add(rr.need)
	default:
		k.mu.Lock()
		rate, capacity := a.emergencyParams(k, rr.rule, rr.need)
		ok, activated, wait := k.fallback.take(now, rr.need, rate, capacity)
		k.mu.Unlock()
		if activated {
			a.ctr.fallbacks.Add(1)
		}
		rr.path = PathFallbackLocal
		if ok {
			rr.ok, rr.undo = true, undoFallback
			k.extra.Add(rr.need)
		} else {
			rr.retry = wait
			if wait < 0 {
				rr.retry = int64(a.cfg.ProbeInterval)
			}
			k.denied.Add(rr.need)
		}
	}
}

// emergencyParams is the rate and capacity of k's emergency bucket: the
// regional rate from the last grant (the rule's global rate if there was
// none) divided among the region's agents, times the headroom, with a
// capacity of one lease TTL at that rate (at least the request's tokens).
// Called with k.mu held.
func (a *Agent) emergencyParams(k *keyState, r *policy.Rule, need int64) (rate, capacity float64) {
	rate = r.Rate()
	if k.hasGrant {
		rate = k.regionRate
	}
	rate = rate / float64(max(a.agents.Load(), 1)) * a.cfg.FallbackHeadroom
	return rate, max(float64(need), rate*a.cfg.LeaseTTL.Seconds())
}
