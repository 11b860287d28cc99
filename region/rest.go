package region

import (
	"slices"
	"time"
)

// This file holds keys at rest (docs/DESIGN.md, "Keys at rest"): a key whose
// epoch changed nothing (restQuiet), and that nothing touched since, is
// not visited by Epoch again until something touches it (its tally changes,
// a peer lists it, a store write, a resync), a timer of its own comes due
// (idle, grace, rewrite), or something every key depends on changes (which
// peers and replicas are heard, their streams, the policy). Its epoch would
// change nothing, so skipping it changes nothing: Config.EveryKey runs every
// key every epoch, and the tests compare the two.

// restQuiet is the count of quiet epochs after which a key rests: one, to
// find its epoch changes nothing. The Report of that epoch still takes its
// fingerprint (restNew) of the state it rests in; a second quiet epoch,
// which only waited for that, would change nothing.
const restQuiet = 1

// keyMeta.rest: awake, came to rest at the latest Epoch (its Report takes
// the key's fingerprint), or resting.
const (
	restAwake uint8 = iota
	restNew
	restOn
)

// keyMeta is what Epoch, Report and Tally read of a key to step over it
// when it rests, kept dense beside State.keys (State.meta) so that stepping
// over a million keys reads 16 MB in order rather than a million scattered
// keyStates.
type keyMeta struct {
	wakeAt int64 // when its own timers wake it (UnixNano, 0: never)
	// sameAt is the low 32 bits of State.tallyGen when Observe last found
	// the key's open tally equal to the one closed before, which was
	// published and not empty: a Tally of that generation would change
	// nothing of the key and steps over it (publish.go).
	sameAt uint32
	bucket uint16
	rest   uint8 // restAwake, or restNew or restOn when keyState.quiet >= restQuiet
	// idle is set by Tally on a key it found with nothing observed and
	// nothing published, in a generation: until Observe or its next rest,
	// a Tally of it would change nothing, and Tally steps over it while it
	// rests. Everything else that changes what Tally reads of a key
	// (leaving its generation, above all) touches the key, whose next
	// rest clears idle.
	idle bool
}

// touch wakes a key: something its epoch reads changed.
func (s *State) touch(ks *keyState) {
	if ks.quiet >= restQuiet { // else its meta says awake already: spare the miss
		s.meta[ks.idx].rest = restAwake
	}
	ks.quiet = 0
}

// calm returns the signature of what every key's epoch reads beside its own
// state, and whether keys may rest in this epoch at all: not in one phase
// (Epoch closes the tallies), not after a Restore, not under EveryKey. It is
// a hash: a collision (2⁻⁶⁴ an epoch) wakes the keys an epoch late.
func (s *State) calm(now time.Time) (uint64, bool) {
	if s.cfg.EveryKey || !s.tallied || s.restored {
		return 0, false
	}
	h := fnv{0xcbf29ce484222325}
	for k := 0; k < s.n; k++ {
		h.add(s.exchSince[k])
		h.add(uint64(s.exchRefresh[k]))
		h.add(b2u(s.exchEpoch[k] != 0))
		h.add(b2u(s.heard(now, k)))
		h.add(b2u(s.heardNow[k]))
	}
	for i := range s.replicas {
		r := &s.replicas[i]
		h.add(uint64(r.region)<<33 | uint64(r.inc)<<1 | b2u(r.live))
		h.add(r.since)
		h.add(b2u(now.Sub(r.lastHeard) <= s.cfg.StaleAfter))
	}
	// Not the generation floor: it rises whenever a key's state is dropped
	// (every epoch, where keys go idle all the time), and only a key
	// entering a generation reads it (enter, pendingGifts), which a resting
	// key does not without being touched first: by demand (its tally), a
	// peer listing it in a newer generation, or a gift to Apply. A higher
	// floor only makes pendingGifts false, and a resting key found it false.
	h.add(s.policyGen)
	h.add(s.disagreeGen)
	return h.v, true
}

// heard reports whether peer k's exchange reports are current at now.
func (s *State) heard(now time.Time, k int) bool {
	return !s.exchHeard[k].IsZero() && now.Sub(s.exchHeard[k]) <= s.cfg.StaleAfter
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// epochKeys runs the epoch of every key not at rest into p, dropping the
// keys whose epoch says so.
func (s *State) epochKeys(now time.Time, p *Plan) {
	sig, ok := s.calm(now)
	rest := ok && sig == s.calmSig
	s.calmSig = sig
	ns := now.UnixNano()
	s.resting, s.awake = 0, Awake{}
	for k := range s.heardEp { // the same for every key: now and exchHeard hold still
		s.heardEp[k] = s.heard(now, k)
	}
	for i := 0; i < len(s.keys); {
		if m := &s.meta[i]; rest && m.rest != restAwake && (m.wakeAt == 0 || ns < m.wakeAt) {
			m.rest = restOn // the latest Report took its fingerprint
			s.resting++
			i++
			continue
		}
		s.awake.countVisit(rest, s.meta[i].rest)
		ks := s.keys[i]
		s.wake(ks)
		ks.visit = s.epochs + 1 // this epoch, counted from 1
		s.markUnsaved(ks)
		steps, retired := len(p.steps), len(p.Retire)
		var before restMark
		if ok { // noteRest compares it only when keys may rest
			before = s.restSig(ks)
		}
		if !s.epochKey(now, ks, p) {
			s.removeKey(i)
			continue
		}
		s.noteRest(now, ks, s.pol, before, len(p.steps) != steps || len(p.Retire) != retired, ok)
		i++
	}
	s.epochs++
}

// resting reports whether ks rests: Epoch steps over it unless a timer of
// it is due.
func (ks *keyState) resting() bool { return ks.quiet >= restQuiet }

// wake brings a key that rested through epochs up to date before its
// epoch: its smoothed demand follows, epoch by epoch, the demand it saw
// when it came to rest (until nothing changes any more), and one that had
// demand had it in every epoch it rested. The epochs it rested through are
// those completed since the one it is current in (keyState.visit, counting
// State.epochs from 1).
func (s *State) wake(ks *keyState) {
	if ks.visit == 0 || ks.visit >= s.epochs {
		return // never visited, or current
	}
	skipped := s.epochs - ks.visit
	ks.visit = s.epochs // caught up to the latest epoch
	if ks.restActive {
		ks.lastDemand = s.prevNow
	}
	pol := s.cfg.Policy(ks.key)
	copy(s.x, ks.restX())
	for k := 0; k < s.n; k++ {
		// A region whose tallies were not heard when the key came to rest
		// was not heard through its rest (State.heardNow is in calm's
		// signature): its smoothed demand held still (smoothDemand).
		if ks.unheard&(1<<k) == 0 {
			s.catchUp(ks, k, pol, skipped)
		}
	}
}

// restMark is the state an epoch of a key may change without planning a
// step, but for its smoothed demand (steady says whether that matters) and
// its inTakenStored (kept in State.restIn): compared, not hashed, as it is
// taken twice for every key visited.
type restMark struct {
	gen, floor, unheard     uint64
	base, applied, transfer int64
	tallies, exits          int
}

// restSig returns ks's restMark and copies its inTakenStored to s.restIn.
func (s *State) restSig(ks *keyState) restMark {
	s.restIn = append(s.restIn[:0], ks.inTakenStored()...)
	return s.mark(ks)
}

// mark is ks's restMark.
func (s *State) mark(ks *keyState) restMark {
	return restMark{
		gen: ks.gen, floor: ks.floor, unheard: ks.unheard,
		base: ks.base, applied: ks.applied, transfer: ks.lastTransfer.UnixNano(),
		tallies: len(ks.tallies), exits: len(ks.exits),
	}
}

// sameRest reports whether ks's restMark is still before, restSig's.
func (s *State) sameRest(ks *keyState, before restMark) bool {
	return s.mark(ks) == before && slices.Equal(ks.inTakenStored(), s.restIn)
}

// noteRest counts ks's epoch at now as quiet or not: quiet when it planned
// nothing (moved), changed nothing but its smoothed demand, has nothing in
// flight that a timer or a peer must settle, and its smoothed demand, as it
// converges on the demand it sees now, cannot make it give (steady); then
// it notes that demand, and when its own timers wake it.
func (s *State) noteRest(now time.Time, ks *keyState, pol KeyPolicy, before restMark, moved, ok bool) {
	why := awakeNone
	switch {
	case !ok:
		why = awakeNoRest
	case moved:
		why = awakeMoved
	case !s.sameRest(ks, before):
		why = awakeChanged
	default:
		if why = s.restBlock(now, ks, pol); why == awakeNone && !s.steady(now, ks, pol) {
			why = awakeUnsteady
		}
	}
	if why != awakeNone {
		s.awake.Kept[why]++
		s.touch(ks)
		return
	}
	if ks.quiet < restQuiet {
		ks.quiet++
	}
	copy(ks.restX(), s.x)
	ks.restActive = ks.lastDemand.Equal(now) && !s.heardOnly // not demand it keeps while it rests
	m := &s.meta[ks.idx]
	if m.rest == restAwake && ks.resting() {
		m.rest, m.idle = restNew, false // Tally sees it once at rest
	}
	m.wakeAt = s.wakeAt(now, ks)
}

// steady reports whether ks gives nothing in any epoch while its inputs
// stay as they are. Each region's smoothed demand moves monotonically from
// where it is toward the demand seen (s.x) and no further, so each need
// stays within the interval those ends give it; a gift needs our target at
// least MinTransferPPM under our share, and a target rises with its own
// need and falls with the others' (give or take 1 ppm of rounding), so it
// is enough that our target is not that low at our lowest need and the
// others' highest.
func (s *State) steady(now time.Time, ks *keyState, pol KeyPolicy) bool {
	sh := s.own(ks)
	idle := now.Sub(ks.lastDemand) >= s.cfg.IdleAfter
	if idle { // the targets are the initial shares
		return sh-s.initial[s.self] < 1
	}
	frozen := s.liveRegions(now, ks, sh, idle)
	lo, hi := s.restE[:0], s.restM[:0]
	var sumLo, sumHi float64
	for _, k := range s.live {
		l, h := min(ks.ewma()[k], s.x[k]), max(ks.ewma()[k], s.x[k])
		lo, hi = append(lo, l), append(hi, h)
		sumLo, sumHi = sumLo+l, sumHi+h
	}
	s.restE, s.restM = lo, hi
	s.need, s.weights = s.need[:0], s.weights[:0]
	me := -1
	for i, k := range s.live {
		var need float64
		switch {
		case k == s.self && pol.Rate > 0:
			need = s.rateNeed(lo[i], pol, s.v[k])
		case pol.Rate > 0:
			need = s.rateNeed(hi[i], pol, s.v[k])
		case k == s.self: // relative: ours at its lowest, the others' at their highest
			need = ratio(lo[i], lo[i]+sumHi-hi[i])
		default:
			need = ratio(hi[i], hi[i]+sumLo-lo[i])
		}
		if k == s.self {
			me = i
		}
		s.need = append(s.need, need)
		s.weights = append(s.weights, s.initial[k])
	}
	lt := s.lt[:len(s.live)]
	s.tg.fill(lt, PPM-frozen, s.need, s.cfg.FloorPPM, s.weights)
	if sh-lt[me] < max(s.cfg.MinTransferPPM, 1)-2 {
		return true
	}
	return s.inPlaceOver(lo, hi, PPM-frozen, pol)
}

// inPlaceOver reports whether the key is in place (inPlace) at every point
// of the box of smoothed demands between lo and hi (steady's): an ask
// rises with its need, so the asks fit and are held at every point if they
// are at hi; a bare target rises with its own need and falls with the
// others' (a relative need too: its ratio rises with its own demand and
// falls with the others'), so its extremes are at the box's corners (give
// or take 1 ppm).
func (s *State) inPlaceOver(lo, hi []float64, total int64, pol KeyPolicy) bool {
	band := s.cfg.SettledPPM - 2
	if band < 0 {
		return false
	}
	need, lt := append(s.need[:0], hi...), s.lt[:len(s.live)]
	s.need = need
	if pol.Rate > 0 {
		for i, e := range need {
			need[i] = s.rateNeed(e, pol, s.v[s.live[i]])
		}
		s.tg.fill(lt, total, need, s.cfg.FloorPPM, s.weights)
		if !s.tg.fits {
			return false
		}
		for i, k := range s.live {
			if s.tg.ask[i] > float64(s.v[k]) {
				return false
			}
		}
	}
	for i, k := range s.live {
		for _, up := range [2]bool{true, false} {
			var sum float64
			for j := range s.live {
				e := lo[j]
				if (j == i) == up {
					e = hi[j]
				}
				need[j], sum = e, sum+e
			}
			for j, e := range need { // bare, as inPlace's band
				if pol.Rate > 0 {
					need[j] = s.rateShare(e, pol)
				} else {
					need[j] = ratio(e, sum)
				}
			}
			s.tg.fill(lt, total, need, s.cfg.FloorPPM, s.weights)
			if d := s.v[k] - lt[i]; d > band || -d > band {
				return false
			}
		}
	}
	return true
}

// ratio is a relative need: a of a total, in ppm; 0 of nothing.
func ratio(a, total float64) float64 {
	if !(total > 0) {
		return 0
	}
	return a / total * PPM
}

// restBlock returns what of ks waits for time or for a peer, or awakeNone
// when nothing does: its stored share is known, it has no exit records and
// no peer announces any, its gifts are acknowledged, no gift waits for
// Apply, every peer's state for it is known, and no reclaim can come due
// while the peers are heard.
// A region not heard does not keep it awake: its smoothed demand holds
// still while it stays unheard, which the signature (calm) holds to.
func (s *State) restBlock(now time.Time, ks *keyState, pol KeyPolicy) awakeReason {
	switch {
	case ks.applied < 0:
		return awakeUnapplied
	case len(ks.exits) > 0 || ks.announcing != 0:
		return awakeExits
	case ks.toApply:
		return awakeToApply
	case ks.gen != 0 && !s.settled(ks):
		return awakeUnsettled
	}
	for k := 0; k < s.n; k++ {
		if k == s.self {
			continue
		}
		if !s.known(ks, k) {
			return awakeUnknown
		}
		// A reclaim comes due ReclaimAfter after a peer was last heard.
		if pol.ReclaimAfter > 0 && (!s.heardEp[k] || pol.ReclaimAfter <= s.cfg.StaleAfter) {
			return awakeReclaim
		}
	}
	return awakeNone
}

// wakeAt returns when ks's own timers next change its epoch (UnixNano, 0:
// never): it goes idle IdleAfter after its last demand, may retire Grace
// after its last transfer, and has its share rewritten Rewrite after its
// last write.
func (s *State) wakeAt(now time.Time, ks *keyState) int64 {
	var at time.Time
	soonest := func(t time.Time) {
		if t.After(now) && (at.IsZero() || t.Before(at)) {
			at = t
		}
	}
	if !ks.restActive {
		soonest(ks.lastDemand.Add(s.cfg.IdleAfter))
		soonest(ks.lastTransfer.Add(s.cfg.Grace))
	}
	if s.cfg.Rewrite > 0 && !ks.written.IsZero() {
		soonest(ks.written.Add(s.cfg.Rewrite))
	}
	if at.IsZero() {
		return 0
	}
	return at.UnixNano()
}

// PolicyChanged wakes every key: call it when the policy the Config's
// Policy returns may have changed, as a key at rest is not visited again
// until something it reads changes.
func (s *State) PolicyChanged() { s.policyGen++ }

// Resting returns how many of the keys the State holds the latest Epoch
// skipped at rest, and how many it holds.
func (s *State) Resting() (resting, keys int) { return s.resting, len(s.keys) }
