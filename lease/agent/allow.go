package agent

import (
	"context"
	"math"
	"math/bits"
	"time"

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
	nsPerToken float64 // the rule's period ÷ limit, for Reset

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

// Allow decides one request described by ds, spending hits × cost tokens of
// every rule that matches (hits below 1 count as 1). Every matching rule
// must allow; tokens are taken only when all do.
//
// A request whose keys hold leased tokens is decided with atomics on local
// memory, allocating nothing. A key without tokens costs one synchronous
// round trip bounded by RoundTripTimeout; while the region is unreachable
// each rule's on_error decides. ctx bounds only that round trip's wait.
func (a *Agent) Allow(ctx context.Context, ds []policy.Descriptor, hits int64) (d Decision) {
	now := a.now()
	s := a.scratch.Get().(*scratch)
	// The decision is written in place, into the result, rather than
	// copied back up through each call: on this path the copies cost more
	// than the arithmetic.
	if a.decideLocal(&d, s, now, ds, hits) {
		a.finishInto(&d, s, a.slowPath(ctx, s, now))
	}
	a.count(s, now, d.Path, d.Allowed)
	s.synced = false
	a.scratch.Put(s)
	return d
}

// decideLocal decides, at now, what can be decided without a round trip:
// it matches ds against the policy, spends leased tokens, queues a refresh
// for a key left below low water, and answers from the deny cache. It
// reports slow when some rule needs the region (a key without tokens and
// without a deny cache entry); d is then untouched and s holds the rules'
// results so far for the slow path. Otherwise the request is decided into
// d. Allow and the simulator's Driver both decide through it, so that the
// simulator runs the agent's rules rather than a copy of them.
func (a *Agent) decideLocal(d *Decision, s *scratch, now int64, ds []policy.Descriptor, hits int64) (slow bool) {
	hits = max(hits, 1)
	if set := a.pol.Load(); s.sameMatch(set, ds, hits) {
		for i := range s.res {
			rr := &s.res[i]
			rr.done, rr.ok, rr.path, rr.retry, rr.f, rr.undo = false, false, PathNone, 0, nil, undoNone
		}
	} else {
		s.memoOK = false
		s.rules = set.Match(s.rules[:0], ds)
		s.res = s.res[:0]
		s.buf = s.buf[:0]
		for _, r := range s.rules {
			start := len(s.buf)
			s.buf = append(s.buf, r.Name...)
			s.buf = append(s.buf, 0)
			s.buf = r.AppendKey(s.buf, ds)
			s.res = append(s.res, ruleResult{rule: r, need: tokens(hits, r.Cost), start: start, end: len(s.buf), nameLen: len(r.Name)})
		}
		for i := range s.res {
			s.res[i].k = a.keys.get(s.buf[s.res[i].start:s.res[i].end])
		}
		s.memoSet, s.memoHits, s.memoOK = set, hits, true
		s.memoDs = append(s.memoDs[:0], ds...)
	}
	if len(s.res) == 0 {
		*d = Decision{Allowed: true}
		return false
	}
	for i := range s.res {
		rr := &s.res[i]
		if rr.need > min(rr.rule.Burst, maxSpend) {
			// More than the rule's whole bucket: no lease can ever hold it.
			rr.done, rr.path = true, PathLease
			if rr.k != nil {
				rr.k.denied.Add(min(rr.need, maxSpend))
			}
			if !rr.rule.Shadow {
				a.finishInto(d, s, now)
				return false
			}
			continue
		}
		if rr.k == nil {
			slow = true
			continue
		}
		if j, w, ok := a.take(rr.k, s.stripeIdx, now, rr.need); ok {
			rr.leased(j, w)
			if j < cacheSlot {
				if lw := rr.k.lowWater.Load(); balance(w) < lw && balance(w)+rr.k.slots.otherLive(j, now) < lw {
					a.queueRefresh(rr.k)
				}
			}
			continue
		}
		if du := rr.k.denyUntil.Load(); now < du && rr.k.liveTokens(now) < rr.need {
			rr.done, rr.path, rr.retry = true, PathDenyCache, du-now
			rr.k.denied.Add(rr.need)
			if !rr.rule.Shadow {
				a.finishInto(d, s, now)
				return false
			}
			continue
		}
		slow = true
	}
	if !slow {
		a.finishInto(d, s, now)
	}
	return slow
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

// finish turns the rules' results into the Decision. A denial by an
// enforced rule gives back every token taken (from leases this agent holds,
// never from the region: the region already debited them when it leased
// them, so putting them back locally cannot admit anything the region did
// not grant), and is described by the denying rule with the longest wait.
func (a *Agent) finish(s *scratch, now int64) Decision {
	var d Decision
	a.finishInto(&d, s, now)
	return d
}

// finishInto is finish writing into d.
func (a *Agent) finishInto(d *Decision, s *scratch, now int64) {
	if len(s.res) == 1 && s.res[0].ok && !s.res[0].rule.Shadow {
		// The common case, one enforced rule that allowed: no ranking.
		rr := &s.res[0]
		a.allowedInto(d, rr, rr.path, now)
		return
	}
	var deny, shadow, tight *ruleResult
	tightness := math.Inf(1)
	path := PathLease
	for i := range s.res {
		rr := &s.res[i]
		if !rr.done {
			continue
		}
		if rr.rule.Shadow {
			if !rr.ok && shadow == nil {
				shadow = rr
			}
			continue
		}
		if !rr.ok {
			if deny == nil || rr.retry > deny.retry {
				deny = rr
			}
			continue
		}
		if rr.path > path {
			path = rr.path // FALLBACK_LOCAL and FAILED_OPEN outrank LEASE
		}
		rem := a.remaining(rr, now)
		if t := float64(rem) / float64(rr.rule.Limit); t < tightness {
			tight, tightness = rr, t
		}
	}
	if deny != nil {
		a.undoAll(s)
		*d = Decision{
			Limit:      deny.rule.Limit,
			Period:     deny.rule.Period,
			Reset:      deny.rule.Period,
			RetryAfter: time.Duration(max(deny.retry, 0)),
			Rule:       deny.rule.Name,
			Path:       deny.path,
		}
		return
	}
	if shadow != nil {
		*d = Decision{
			Allowed:    true,
			Limit:      shadow.rule.Limit,
			Period:     shadow.rule.Period,
			Reset:      shadow.rule.Period,
			RetryAfter: time.Duration(max(shadow.retry, 0)),
			Rule:       shadow.rule.Name,
			Path:       PathShadow,
		}
		return
	}
	if tight == nil {
		// Only shadow rules matched, and they all would have allowed: no
		// rule decided.
		*d = Decision{Allowed: true}
		return
	}
	a.allowedInto(d, tight, path, now)
}

// allowedInto describes, in d, a request allowed by rule result rr.
func (a *Agent) allowedInto(d *Decision, rr *ruleResult, path Path, now int64) {
	r := rr.rule
	rem := a.remaining(rr, now)
	if rr.nsPerToken == 0 { // kept by the memo: one division per match
		rr.nsPerToken = float64(r.Period) / float64(r.Limit)
	}
	d.Allowed = true
	d.Limit = r.Limit
	d.Period = r.Period
	d.Remaining = rem
	d.Reset = time.Duration(float64(r.Limit-rem) * rr.nsPerToken)
	d.RetryAfter = 0
	d.Rule = r.Name
	d.Path = path
}

// remaining estimates a key's tokens left for headers: its leased tokens
// plus the regional bucket's tokens at the last grant, at most the rule's
// limit. After a spend it counts the lease spent from, as the spend left it,
// rather than reading the slots again: on a hot key they are the cache line
// every core is writing.
func (a *Agent) remaining(rr *ruleResult, now int64) int64 {
	if rr.k == nil {
		return rr.rule.Limit
	}
	var local int64
	if rr.undo == undoSlot {
		local = balance(rr.word)
	} else {
		local = rr.k.liveTokens(now)
	}
	return min(local+rr.k.remaining.Load(), rr.rule.Limit)
}

// undoAll gives back what a denied request took.
func (a *Agent) undoAll(s *scratch) {
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
				a.ctr.dropped.Add(rr.need)
			}
		case undoFallback:
			rr.k.mu.Lock()
			_, capacity := a.emergencyParams(rr.k, rr.rule, rr.need)
			rr.k.fallback.give(rr.need, capacity)
			rr.k.mu.Unlock()
			rr.k.extra.Add(-rr.need)
		case undoExtra:
			rr.k.extra.Add(-rr.need)
		}
		rr.undo = undoNone
	}
}

// queueRefresh asks the refresher to renew k's lease, once until the
// renewal completes.
func (a *Agent) queueRefresh(k *keyState) {
	if k.queued.Load() || !k.queued.CompareAndSwap(false, true) {
		return
	}
	a.qmu.Lock()
	a.queue = append(a.queue, k)
	a.qmu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// record counts the decision by path and outcome on the caller's stripe,
// and times one decision in 64 for the latency histogram.
func (a *Agent) record(s *scratch, now int64, d Decision) { a.count(s, now, d.Path, d.Allowed) }

// count is record taking only what it needs of the decision.
func (a *Agent) count(s *scratch, now int64, path Path, allowed bool) {
	o := 0
	if allowed {
		o = 1
	}
	n := s.stripe.decisions[path][o].Add(1)
	if s.synced {
		s.stripe.synced.Add(1)
	}
	if n%64 == 0 && a.metrics.latency != nil {
		a.metrics.latency.Observe(float64(a.now()-now) / 1e9)
	}
}
