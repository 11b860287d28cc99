package agent

import "github.com/ration-dev/ration/policy"

// mayCall reports whether the region may be called now: the breaker is
// closed, or it is open and this call is its probe.
func (c *core) mayCall(now int64) (call, probe bool) {
	if c.closed.Load() {
		return false, false
	}
	if !c.down.Load() {
		return true, false
	}
	c.bmu.Lock()
	defer c.bmu.Unlock()
	call = c.br.allow(now)
	return call, call && c.br.open
}

func (c *core) releaseProbe() {
	c.bmu.Lock()
	c.br.probing = false
	c.bmu.Unlock()
}

// callDone feeds a round trip's outcome to the breaker.
func (c *core) callDone(now int64, ok bool) {
	c.bmu.Lock()
	opened, closed := c.br.done(now, ok)
	if opened || closed {
		c.down.Store(c.br.open)
	}
	c.bmu.Unlock()
	if opened {
		c.ctr.breakerOpened.Add(1)
		c.cfg.Logger.Warn("region unreachable: deciding by each rule's failure mode", "target", c.cfg.Target)
	}
	if closed {
		c.cfg.Logger.Info("region reachable again")
	}
}

// failMode decides a rule by its on_error, for a key that needs the region
// while the region cannot be reached (DESIGN.md, "Failure modes").
func (c *core) failMode(rr *ruleResult, now int64) {
	rr.done = true
	k := rr.k
	c.probeKey.Store(k)
	switch rr.rule.OnError {
	case policy.OnErrorOpen:
		rr.ok, rr.path, rr.undo = true, PathFailedOpen, undoExtra
		k.rareState().extra.Add(rr.need)
	case policy.OnErrorClosed:
		rr.path, rr.retry = PathFailedClosed, int64(c.cfg.ProbeInterval)
		k.addDenied(rr.need)
	default:
		k.mu.Lock()
		rate, start, capacity := c.emergencyParams(k, rr.rule, rr.need)
		r := k.rareLocked()
		ok, activated, wait := r.fallback.take(now, rr.need, rate, start, capacity)
		k.mu.Unlock()
		if activated {
			c.ctr.fallbacks.Add(1)
		}
		rr.path = PathFallbackLocal
		if ok {
			rr.ok, rr.undo = true, undoFallback
			r.extra.Add(rr.need)
		} else {
			rr.retry = wait
			if wait < 0 {
				rr.retry = int64(c.cfg.ProbeInterval)
			}
			r.denied.Add(rr.need)
		}
	}
}

// emergencyParams is k's emergency bucket (DESIGN.md, "Failure modes"):
// its rate is the regional rate from the last grant (the rule's global rate
// if there was none) divided among the region's agents, times the
// headroom; it starts with one cost, so that a key's first request when
// the region cannot be reached is admitted however slow its quota; and it
// banks at most max(τ, period/10) at that rate (at least the request's
// tokens), so that the bursts of a slow quota can use the rate, while a
// per-second quota banks one lease TTL, as before. Called with k.mu held.
func (c *core) emergencyParams(k *keyState, r *policy.Rule, need int64) (rate, start, capacity float64) {
	rate = r.Rate()
	if k.flags.has(flagGranted) {
		rate = float64(k.regionRate)
	}
	rate = rate / float64(max(c.agents.Load(), 1)) * c.cfg.FallbackHeadroom
	start = float64(r.Cost)
	capacity = max(float64(need), start, rate*max(c.cfg.LeaseTTL.Seconds(), r.Period.Seconds()/10))
	return rate, start, capacity
}
