package agent

import (
	"math"
	"time"
)

// finish turns the rules' results into the Decision. A denial by an
// enforced rule gives back every token taken (from leases this agent holds,
// never from the region: the region already debited them when it leased
// them, so putting them back locally cannot admit anything the region did
// not grant), and is described by the denying rule with the longest wait.
func (c *core) finish(s *scratch, now int64) Decision {
	var d Decision
	c.finishInto(&d, s, now)
	return d
}

// finishInto is finish writing into d.
func (c *core) finishInto(d *Decision, s *scratch, now int64) {
	if len(s.res) == 1 && s.res[0].ok && !s.res[0].rule.Shadow {
		// The common case, one enforced rule that allowed: no ranking.
		rr := &s.res[0]
		s.by = rr.ctr
		c.allowedInto(d, rr, rr.path, now)
		return
	}
	deny, shadow, tight, path := c.rank(s, now)
	s.by = nil
	if deny != nil {
		s.by = deny.ctr
		c.undoAll(s)
		*d = Decision{
			Limit:      deny.rule.Limit,
			Period:     deny.rule.Period,
			Reset:      deny.rule.Period,
			RetryAfter: time.Duration(max(deny.retry, 0)),
			Rule:       deny.rule.Name,
			Path:       deny.path,
		}
		if deny.fixed {
			c.describeWindow(d, deny, now)
		}
		return
	}
	if shadow != nil {
		s.by = shadow.ctr
		*d = Decision{
			Allowed:    true,
			Limit:      shadow.rule.Limit,
			Period:     shadow.rule.Period,
			Reset:      shadow.rule.Period,
			RetryAfter: time.Duration(max(shadow.retry, 0)),
			Rule:       shadow.rule.Name,
			Path:       PathShadow,
		}
		if shadow.fixed {
			c.describeWindow(d, shadow, now)
		}
		return
	}
	if tight == nil {
		// Only shadow rules matched, and they all would have allowed: no
		// rule decided.
		*d = Decision{Allowed: true}
		return
	}
	s.by = tight.ctr
	c.allowedInto(d, tight, path, now)
}

// rank picks, among the decided rules of s, the enforced rule that denied
// with the longest wait, the first shadow rule that would have denied, and
// the tightest enforced rule that allowed (least remaining relative to its
// limit), with the path that outranks the others of the allowing rules.
func (c *core) rank(s *scratch, now int64) (deny, shadow, tight *ruleResult, path Path) {
	tightness := math.Inf(1)
	path = PathLease
	for i := range s.res {
		rr := &s.res[i]
		switch {
		case !rr.done:
		case rr.rule.Shadow:
			if !rr.ok && shadow == nil {
				shadow = rr
			}
		case !rr.ok:
			if deny == nil || rr.retry > deny.retry {
				deny = rr
			}
		default:
			if rr.path > path {
				path = rr.path // FALLBACK_LOCAL and FAILED_OPEN outrank LEASE
			}
			rem := c.remaining(rr, now)
			if t := float64(rem) / float64(rr.rule.Limit); t < tightness {
				tight, tightness = rr, t
			}
		}
	}
	return deny, shadow, tight, path
}

// allowedInto describes, in d, a request allowed by rule result rr.
func (c *core) allowedInto(d *Decision, rr *ruleResult, path Path, now int64) {
	r := rr.rule
	rem := c.remaining(rr, now)
	d.Allowed = true
	d.Limit = r.Limit
	if rr.fixed {
		c.describeWindow(d, rr, now)
	} else {
		if rr.nsPerToken == 0 { // kept by the memo: one division per match
			rr.nsPerToken = float64(r.Period) / float64(r.Limit)
		}
		d.Period = r.Period
		d.Reset = time.Duration(float64(r.Limit-rem) * rr.nsPerToken)
		d.Window = Window{}
	}
	d.Remaining = rem
	d.RetryAfter = 0
	d.Rule = r.Name
	d.Path = path
}

// remaining estimates a key's tokens left for headers: its leased tokens
// plus the regional bucket's tokens at the last grant, at most the rule's
// limit. After a spend it counts the lease spent from, as the spend left it,
// rather than reading the slots again: on a hot key they are the cache line
// every core is writing.
func (c *core) remaining(rr *ruleResult, now int64) int64 {
	if rr.k == nil {
		return rr.rule.Limit
	}
	var local int64
	if rr.undo == undoSlot {
		local = balance(rr.word)
	} else {
		local = rr.k.liveTokens(now)
	}
	return min(local+int64(math.Float32frombits(rr.k.remaining.Load())), rr.rule.Limit)
}

// undoAll gives back what a denied request took.
func (c *core) undoAll(s *scratch) {
	for i := range s.res {
		rr := &s.res[i]
		if !rr.done || !rr.ok {
			continue
		}
		switch rr.undo {
		case undoSlot:
			var ok bool
			if rr.slot >= cacheSlot {
				ok = rr.k.putBackCache(rr.slot-cacheSlot, rr.word, rr.need)
			} else {
				ok = rr.k.slots.putBack(rr.slot, rr.word, rr.need)
			}
			if !ok {
				c.ctr.dropped.Add(rr.need)
			}
		case undoFallback:
			rr.k.mu.Lock()
			_, _, capacity := c.emergencyParams(rr.k, rr.rule, rr.need)
			rr.k.fallback().give(rr.need, capacity)
			rr.k.mu.Unlock()
			rr.k.rare.Load().extra.Add(-rr.need)
		case undoExtra:
			rr.k.rare.Load().extra.Add(-rr.need)
		}
		rr.undo = undoNone
	}
}
