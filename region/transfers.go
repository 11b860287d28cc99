package region

import (
	"math"
	"time"
)

// This file holds how a key's targets are set and what share moves toward
// them in an epoch: gifts of our surplus and reclaims from silent peers.

// targets returns every region's target share for the key. Peers heard
// lately are live: those in our generation can receive gifts, the others
// (no exchange state yet, or another generation) will join ours within an
// epoch, bringing their share, so they take part in the water-filling but
// receive nothing yet. Peers not heard are frozen at their current share
// (fail-static) and the water-filling divides what is left.
func (s *State) targets(now time.Time, ks *keyState, pol KeyPolicy, sh int64, idle bool) []int64 {
	frozen := s.liveRegions(now, ks, sh, idle)
	if idle {
		for _, k := range s.live {
			s.t[k] = s.initial[k]
		}
		return s.t
	}
	s.needs(ks, pol)
	lt := s.lt[:len(s.live)]
	s.tg.fill(lt, PPM-frozen, s.need, s.cfg.FloorPPM, s.weights)
	for i, k := range s.live {
		s.t[k] = lt[i]
	}
	return s.t
}

// liveRegions decides which regions are live (s.live, s.recv); it freezes the others and returns their total.
func (s *State) liveRegions(now time.Time, ks *keyState, sh int64, idle bool) (frozen int64) {
	me := s.self
	s.live = s.live[:0]
	// s.v is every region's share as we see it.
	for k := 0; k < s.n; k++ {
		s.recv[k] = false
		if k == me {
			s.v[k] = sh
			s.live = append(s.live, k)
			continue
		}
		g := s.peerGen(ks, k)
		inGen := g == ks.gen && ks.rowGen()[k] == ks.gen
		switch {
		case inGen:
			s.v[k] = s.view(ks, k)
		case g != 0:
			s.v[k] = ks.shares()[k] // in another generation, on its way to ours
		default:
			s.v[k] = s.initial[k] // no state: the store's initial share
		}
		heard := s.heardEp[k] // heard(now, k): liveRegions runs in epochKeys
		// An idle key gives back toward the initial shares even to a
		// silent peer: the gift waits for it, and we keep the key until
		// it is acknowledged.
		if inGen && (heard || idle) || heard && !idle {
			s.live = append(s.live, k)
			s.recv[k] = inGen
		} else {
			s.t[k] = s.v[k]
			frozen += max(s.v[k], 0)
		}
	}
	return frozen
}

// needs decides each live region's need in ppm (s.need), the same without
// the noise headroom (s.bare), and water-filling weight (s.weights).
func (s *State) needs(ks *keyState, pol KeyPolicy) {
	// The share that serves the smoothed demand at the key's rate, or,
	// without a rate, a part of the live regions' demand.
	s.need, s.bare, s.weights = s.need[:0], s.bare[:0], s.weights[:0]
	s.headroom = false
	var sum float64
	for _, k := range s.live {
		sum += ks.ewma()[k]
	}
	for _, k := range s.live {
		var need, bare float64
		switch {
		case pol.Rate > 0:
			need, bare = s.rateNeed(ks.ewma()[k], pol, s.v[k]), s.rateShare(ks.ewma()[k], pol)
		case sum > 0:
			need = ks.ewma()[k] / sum * PPM
			bare = need
		}
		s.need, s.bare = append(s.need, need), append(s.bare, bare)
		s.headroom = s.headroom || bare != need
		s.weights = append(s.weights, s.initial[k])
	}
}

// rateNeed is the need in ppm of a smoothed demand of e tokens an epoch
// for a key with a rate, in a region holding share sh: the share that
// serves it (rateShare), plus headroom for Poisson noise where that exceeds
// the floor (small keys). The headroom is one standard deviation of the
// epoch's demand, or, where sh already serves e, of its mean over the
// epochs the bucket absorbs the noise (bucketHorizon): a region still short
// of its demand keeps the whole headroom.
func (s *State) rateNeed(e float64, pol KeyPolicy, sh int64) float64 {
	per := pol.Rate * s.periodSec
	need := s.rateShare(e, pol)
	h := noise(e, pol.Cost) / per * PPM
	if need <= float64(sh) {
		h /= math.Sqrt(s.bucketHorizon(pol, e))
	}
	if h > float64(s.cfg.FloorPPM) {
		need += h - float64(s.cfg.FloorPPM)
	}
	return need
}

// rateShare is the share in ppm that serves a smoothed demand of e tokens
// an epoch at the key's rate, without headroom.
func (s *State) rateShare(e float64, pol KeyPolicy) float64 {
	return e / (pol.Rate * s.periodSec) * PPM
}

// giftsFor splits our surplus over the live peers below target, in
// proportion to their deficits: when every giver does so with the same view,
// each deficit is filled exactly in one epoch.
func (s *State) giftsFor(ks *keyState, sh int64, t []int64, idle bool) []int64 {
	if !idle && s.inPlace(t) {
		return nil
	}
	me := s.self
	surplus := sh - t[me]
	least := max(s.cfg.MinTransferPPM, 1)
	if idle {
		least = 1
	}
	if surplus < least {
		return nil
	}
	var deficit int64
	for _, k := range s.live {
		if s.recv[k] && t[k] > s.v[k] {
			deficit += t[k] - s.v[k]
		}
	}
	give := min(surplus, deficit)
	if give < least {
		return nil
	}
	g := s.rowBuf(nil)
	var given int64
	for _, k := range s.live {
		if s.recv[k] && t[k] > s.v[k] {
			g[k] = give * (t[k] - s.v[k]) / deficit
			given += g[k]
		}
	}
	// Hand out the rounding remainder one ppm at a time, lowest index first.
	for _, k := range s.live {
		if given == give {
			break
		}
		if s.recv[k] && t[k] > s.v[k] {
			g[k]++
			given++
		}
	}
	return g
}

// inPlace reports whether a key with targets t (s.targets' latest, not
// idle) has nothing to move: every live region holds at least its ask (its
// need and headroom) and every share is within SettledPPM of its bare
// target (bareTargets). Such a key serves every region's demand where it
// is, and moving its share would only chase the noise of small demands
// (docs/DESIGN.md, "Settled keys"). A key without a rate (relative needs)
// has no ask a share can hold, as its needs sum to the whole quota: it is
// in place when every share is within the band of its target.
func (s *State) inPlace(t []int64) bool {
	band := s.cfg.SettledPPM
	if band < 0 {
		return false
	}
	if s.pol.Rate > 0 {
		if !s.tg.fits {
			return false
		}
		for i, k := range s.live {
			if s.tg.ask[i] > float64(s.v[k]) {
				return false
			}
		}
	}
	bt := s.bareTargets(t)
	for i, k := range s.live {
		if d := s.v[k] - bt[i]; d > band || -d > band {
			return false
		}
	}
	return true
}

// bareTargets returns the live regions' targets (in s.live's order) for
// their needs without the noise headroom (s.bare), for a key whose asks
// fit: the max-min division of the smoothed demand itself, which is what
// the tests and the simulator measure convergence to. The band is measured
// from these rather than from the targets t: the asks already hold the
// headroom, and a band around t would add the headroom's shift of the
// targets (up to about 30,000 ppm for a region of a thousand requests an
// epoch) to the band's own width, leaving a settled share beyond the
// 50,000 the band is meant to stay under (TestSettledBandIsBare).
func (s *State) bareTargets(t []int64) []int64 {
	bt := s.lt[:len(s.live)]
	var total int64 // the targets divide the quota less the frozen shares
	for i, k := range s.live {
		total += t[k]
		bt[i] = t[k]
	}
	if !s.headroom { // relative needs, or small demands: the same
		return bt
	}
	s.bareTg.fill(bt, total, s.bare, s.cfg.FloorPPM, s.weights)
	return bt
}

// reclaims returns what we take, for a key with partition_reclaim_after, from
// peers in our generation that were silent that long: their share above the
// floor, split so that all other regions together take at most all of it.
// Once per peer per generation.
func (s *State) reclaims(now time.Time, ks *keyState, pol KeyPolicy) []int64 {
	after := pol.ReclaimAfter
	if after <= 0 || s.n < 2 {
		return nil
	}
	var takes []int64
	tk := s.ownTaken(ks)
	for k := 0; k < s.n; k++ {
		if k == s.self || tk[k] > 0 || ks.rowGen()[k] != ks.gen || s.peerGen(ks, k) != ks.gen {
			continue
		}
		since := s.exchHeard[k]
		if since.Before(ks.created) {
			since = ks.created
		}
		if now.Sub(since) < after {
			continue
		}
		if x := (s.view(ks, k) - s.cfg.FloorPPM) / int64(s.n-1); x > 0 {
			if takes == nil {
				takes = s.rowBuf(nil)
			}
			takes[k] = x
		}
	}
	return takes
}
