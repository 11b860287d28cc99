package agent

import "time"

// maxAttempts bounds the round trips one request makes: after a grant,
// other requests may take the tokens first (a cold key's first leases are
// small and grow by doubling), so a request tries again within its
// deadline, up to this many times, before it gives up.
const maxAttempts = 8

// slowAttempt starts attempt n (from 0) of the slow path at now. It reports
// decided when there is nothing to ask the region: every rule is decided,
// the attempts are used up (giveUp), live tokens split across slots covered
// the rest, or the region may not be called (each undecided rule's failure
// mode decides). Otherwise every undecided rule waits for its key's round
// trip (ruleResult.f), and own, when not nil, is a new flight of this
// request for the caller to send.
func (c *core) slowAttempt(s *scratch, n int, now int64) (own *flight, decided bool) {
	if !c.pendingRules(s) {
		return nil, true
	}
	if n >= maxAttempts {
		c.giveUp(s)
		return nil, true
	}
	if c.fromSplitLeases(s, now) && !c.pendingRules(s) {
		return nil, true
	}
	call, probe := c.mayCall(now)
	if !call {
		for i := range s.res {
			if rr := &s.res[i]; !rr.done {
				c.ensureKey(s, rr, now)
				c.failMode(rr, now)
			}
		}
		return nil, true
	}
	s.synced = true
	own = c.joinOrStart(s, now)
	if own == nil && probe {
		c.releaseProbe()
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
func (c *core) slowSettle(s *scratch, now int64, expired bool) (decided bool) {
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
			c.failMode(rr, now) // the region did not answer in time
			continue
		}
		if f.err != nil {
			c.failMode(rr, now)
			continue
		}
		if j, w, ok := c.take(rr.k, s.stripeIdx, now, rr.need); ok {
			rr.leased(j, w)
			continue
		}
		if du := rr.k.denyUntil.Load(); now < du {
			// The region just granted too little: a denial on the lease
			// path; later requests meet the deny cache.
			rr.done, rr.path, rr.retry = true, PathLease, c.denyRetry(rr, du, now)
			rr.k.addDenied(rr.need)
			if !rr.rule.Shadow {
				return true
			}
		}
	}
	if timedOut {
		c.giveUp(s)
		return true
	}
	if expired {
		for i := range s.res {
			if rr := &s.res[i]; !rr.done {
				c.failMode(rr, now)
			}
		}
		return true
	}
	return !c.pendingRules(s)
}

// giveUp denies what is still undecided after every attempt: the tokens
// granted went to other requests each time.
func (c *core) giveUp(s *scratch) {
	for i := range s.res {
		if rr := &s.res[i]; !rr.done {
			rr.done, rr.path, rr.retry = true, PathLease, int64(time.Millisecond)
			rr.k.addDenied(rr.need)
		}
	}
}

// fromSplitLeases serves undecided rules whose keys hold enough live
// tokens in total but not in any one slot or stripe entry, by gathering
// them into one slot first. It reports whether it decided any.
func (c *core) fromSplitLeases(s *scratch, now int64) bool {
	any := false
	for i := range s.res {
		rr := &s.res[i]
		if rr.done || rr.k == nil || rr.k.liveTokens(now) < rr.need {
			continue
		}
		rr.k.mu.Lock()
		c.dropLocked(rr.k, rr.k.consolidateLocked(now))
		rr.k.mu.Unlock()
		if j, w, ok := c.take(rr.k, s.stripeIdx, now, rr.need); ok {
			rr.leased(j, w)
			any = true
		}
	}
	return any
}

// ensureKey gives rr a live key state, creating one for a new key. A new
// key is scheduled for an idle check, so that keys which never get a lease
// (decided by failure modes, say) are still forgotten once idle.
func (c *core) ensureKey(s *scratch, rr *ruleResult, now int64) {
	if rr.k != nil && !rr.k.isEvicted() {
		return
	}
	nameLen, created := rr.nameLen, false
	rr.k = c.keys.getOrCreate(s.buf[rr.start:rr.end], func(id []byte) *keyState {
		created = true
		return newKeyState(id, nameLen, now)
	})
	if created {
		c.scheduleAt(rr.k, now+int64(c.cfg.IdleAfter))
	}
}

func (c *core) pendingRules(s *scratch) bool {
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
func (c *core) joinOrStart(s *scratch, now int64) *flight {
	var own *flight
	for i := range s.res {
		rr := &s.res[i]
		if rr.done {
			continue
		}
		for {
			c.ensureKey(s, rr, now)
			k := rr.k
			k.mu.Lock()
			if k.isEvicted() {
				k.mu.Unlock()
				continue
			}
			k.lastActive = now
			if k.flight != nil {
				k.rareLocked().joined += rr.need
			} else {
				if own == nil {
					own = &flight{done: make(chan struct{}), sync: true}
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

// awaited returns a round trip that an undecided rule of s waits for and
// that has not completed, or nil when all of them have.
func (s *scratch) awaited() *flight {
	for i := range s.res {
		if rr := &s.res[i]; !rr.done && rr.f != nil && !flightDone(rr.f) {
			return rr.f
		}
	}
	return nil
}
