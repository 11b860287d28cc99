package agent

import (
	"math"
	"math/bits"

	"github.com/ration-dev/ration/policy"
)

// scratch is one decision's working memory, pooled so that a decision on
// leased keys allocates nothing.
type scratch struct {
	rules     []*policy.Rule
	res       []ruleResult
	buf       []byte // the ids of the matched keys, back to back
	stripe    *stripe
	stripeIdx int
	synced    bool // the decision needed a round trip
	// by counts the decision: the counters, on this scratch's stripe, of
	// the rule that decided it (nil: none did), set by finishInto.
	by *ruleStripe
	// ctrRules and ctrs remember the counters of the last rules matched,
	// so that a match mostly finds its rules' counters without a map
	// lookup (a rule's counters never change: they go by its name).
	ctrRules [4]*policy.Rule
	ctrs     [4]*ruleStripe
	ctrNext  int

	// A memo of the previous decision's match: sync.Pool keeps a scratch
	// on one P, and a P that decides the same descriptors again (a hot key)
	// skips matching, building the keys and the map lookups. The key states
	// may have been evicted since; their spends then fail and the slow path
	// finds the live ones.
	memoSet  *policy.Set
	memoDs   []policy.Descriptor
	memoHits int64
	memoOK   bool
}

// sameMatch reports whether the memo holds the match of ds under set.
// Comparing strings that share their bytes stops at the pointers.
func (s *scratch) sameMatch(set *policy.Set, ds []policy.Descriptor, hits int64) bool {
	if !s.memoOK || set != s.memoSet || hits != s.memoHits || len(ds) != len(s.memoDs) {
		return false
	}
	for i := range ds {
		if ds[i] != s.memoDs[i] {
			return false
		}
	}
	return true
}

// ruleResult is what one matched rule said about the request.
type ruleResult struct {
	rule       *policy.Rule
	k          *keyState
	need       int64 // tokens: hits × cost
	start, end int   // the key's id in scratch.buf
	nameLen    int
	nsPerToken float64      // the rule's period ÷ limit, for Reset
	fixed      bool         // the rule is a fixed window
	win        *windowCache // a fixed window's current window (nil: compute it)
	ctr        *ruleStripe  // the rule's decision counters on the scratch's stripe

	done  bool // decided
	ok    bool // allowed (for a shadow rule: would have allowed)
	path  Path
	retry int64 // nanos, for a denial

	f *flight // the round trip the slow path waited for

	undo undoKind // how to give back what was taken if another rule denies
	slot int
	word int64
}

type undoKind uint8

const (
	undoNone undoKind = iota
	undoSlot
	undoFallback
	undoExtra
)

// decideLocal decides, at now, what can be decided without a round trip:
// it matches ds against the policy, spends leased tokens, queues a refresh
// for a key left below low water, and answers from the deny cache. It
// reports slow when some rule needs the region (a key without tokens and
// without a deny cache entry); d is then untouched and s holds the rules'
// results so far for the slow path. Otherwise the request is decided into
// d.
func (c *core) decideLocal(d *Decision, s *scratch, now int64, ds []policy.Descriptor, hits int64) (slow bool) {
	hits = max(hits, 1)
	if set := c.pol.Load(); s.sameMatch(set, ds, hits) {
		for i := range s.res {
			rr := &s.res[i]
			rr.done, rr.ok, rr.path, rr.retry, rr.f, rr.undo = false, false, PathNone, 0, nil, undoNone
		}
	} else {
		c.match(s, set, ds, hits)
	}
	if len(s.res) == 0 {
		*d = Decision{Allowed: true}
		s.by = nil
		return false
	}
	if c.exceedsBurst(d, s, now) {
		return false
	}
	for i := range s.res {
		rr := &s.res[i]
		if rr.done {
			continue
		}
		if rr.k == nil {
			slow = true
			continue
		}
		if j, w, ok := c.take(rr.k, s.stripeIdx, now, rr.need); ok {
			rr.leased(j, w)
			if j < cacheSlot {
				if lw := int64(rr.k.lowWater.Load()); balance(w) < lw && balance(w)+rr.k.slots.otherLive(j, now) < lw {
					c.queueRefresh(rr.k)
				}
			}
			continue
		}
		if du := rr.k.denyUntil.Load(); now < du && rr.k.liveTokens(now) < rr.need {
			rr.done, rr.path, rr.retry = true, PathDenyCache, c.denyRetry(rr, du, now)
			rr.k.addDenied(rr.need)
			if !rr.rule.Shadow {
				c.finishInto(d, s, now)
				return false
			}
			continue
		}
		slow = true
	}
	if !slow {
		c.finishInto(d, s, now)
	}
	return slow
}

// exceedsBurst denies, into d, a request that needs more tokens than an
// enforced rule's whole bucket holds (no lease can ever hold them), before
// anything is spent, so that the denial names that rule whatever the
// others say (Wait fails fast on it). A shadow rule so exceeded is decided
// as would-deny. It reports whether the request was denied.
func (c *core) exceedsBurst(d *Decision, s *scratch, now int64) bool {
	for i := range s.res {
		rr := &s.res[i]
		if rr.need <= min(rr.rule.Burst, maxSpend) {
			continue
		}
		rr.done, rr.path = true, PathLease
		if rr.k != nil {
			rr.k.addDenied(min(rr.need, maxSpend))
		}
		if !rr.rule.Shadow {
			c.finishInto(d, s, now)
			return true
		}
	}
	return false
}

// match fills s with the rules of set that match ds, each with its key's
// id and state (nil for a key not held), and memoises the match.
func (c *core) match(s *scratch, set *policy.Set, ds []policy.Descriptor, hits int64) {
	s.memoOK = false
	s.rules = set.Match(s.rules[:0], ds)
	s.res = s.res[:0]
	s.buf = s.buf[:0]
	for _, r := range s.rules {
		start := len(s.buf)
		s.buf = append(s.buf, r.Name...)
		s.buf = append(s.buf, 0)
		s.buf = r.AppendKey(s.buf, ds)
		s.res = append(s.res, ruleResult{rule: r, need: tokens(hits, r.Cost), start: start, end: len(s.buf), nameLen: len(r.Name), ctr: c.ruleCounters(s, r)})
		if r.FixedWindow() {
			rr := &s.res[len(s.res)-1]
			rr.fixed, rr.win = true, c.windowOf(r)
		}
	}
	for i := range s.res {
		s.res[i].k = c.keys.get(s.buf[s.res[i].start:s.res[i].end])
	}
	s.memoSet, s.memoHits, s.memoOK = set, hits, true
	s.memoDs = append(s.memoDs[:0], ds...)
}

// ruleCounters returns the decision counters of rule r on s's stripe.
func (c *core) ruleCounters(s *scratch, r *policy.Rule) *ruleStripe {
	for i, cr := range s.ctrRules {
		if cr == r {
			return s.ctrs[i]
		}
	}
	ctr := &c.rules.of(r).stripes[s.stripeIdx]
	i := s.ctrNext % len(s.ctrRules)
	s.ctrNext++
	s.ctrRules[i], s.ctrs[i] = r, ctr
	return ctr
}

// leased records that rr's tokens came from a lease: from slot j (or stripe
// entry j − cacheSlot), which the spend left at word w.
func (rr *ruleResult) leased(j int, w int64) {
	rr.done, rr.ok, rr.path = true, true, PathLease
	rr.undo, rr.slot, rr.word = undoSlot, j, w
}

// tokens is hits × cost, saturating instead of overflowing.
func tokens(hits, cost int64) int64 {
	if hits == 1 {
		return cost
	}
	if hi, lo := bits.Mul64(uint64(hits), uint64(cost)); hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return hits * cost
}

// queueRefresh asks the refresher to renew k's lease, once until the
// renewal completes.
func (c *core) queueRefresh(k *keyState) {
	if k.flags.has(flagQueued) || !k.flags.setFirst(flagQueued) {
		return
	}
	c.qmu.Lock()
	c.queue = append(c.queue, k)
	c.qmu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// count counts a decision by the rule that decided it (s.by), path and
// outcome on the stripe of its scratch s, and returns how many such
// decisions the stripe has counted: a runtime that times decisions samples
// on it.
func (c *core) count(s *scratch, path Path, allowed bool) uint64 {
	o := 0
	if allowed {
		o = 1
	}
	by := s.by
	if by == nil {
		by = &c.rules.none.stripes[s.stripeIdx]
	}
	n := by.decisions[path][o].Add(1)
	if s.synced {
		s.stripe.synced.Add(1)
	}
	return n
}
