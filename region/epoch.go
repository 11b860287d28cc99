package region

import (
	"math"
	"slices"
	"time"
)

// This file holds one key's part of an epoch (epochKey): its smoothed
// demand, its generation, whether it retires, and the step it adds to the
// plan.

// epochKey runs the epoch for one key; false drops the key.
func (s *State) epochKey(now time.Time, ks *keyState, p *Plan) bool {
	if ks.created.IsZero() {
		ks.created, ks.lastDemand, ks.lastTransfer = now, now, now
	}

	// Demand: the EWMA steers by the tallies everyone saw last epoch.
	s.demands(ks, now)
	pol := s.cfg.Policy(ks.key)
	s.pol = pol
	active := s.smoothDemand(ks, pol)
	if active {
		ks.lastDemand = now
	}
	s.heardOnly = false
	if ks.heardDemand && ks.gen != 0 && !ks.lastDemand.Equal(now) {
		// A peer's tally listed demand that a newer one replaced before
		// this epoch read it (several reports between two of our epochs,
		// when ours outlast the period): the key is not idle, though its
		// smoothed demand steers by the latest. Else a key asked once in a
		// while retires in the regions that are not its home whenever
		// their epochs fall behind, and enters again at its next request.
		ks.lastDemand, s.heardOnly = now, true
	}
	ks.heardDemand = false
	if !s.tallied {
		ks.pub, ks.cur0 = s.closing(ks), tally{}
		s.closeTally(ks)
	}
	if len(ks.exits) > 0 { // most keys have none: spare them the call
		s.dropDoneExits(now, ks)
	}
	s.forgetAnnouncers(ks)

	// Generation: enter one, or follow a peer to a newer one.
	if ks.gen == 0 {
		if !active && !s.pendingGifts(ks) {
			return s.keepTombstone(ks)
		}
		s.enter(now, ks, s.initial[s.self])
	} else if g := s.highestPeerGen(ks); g > ks.gen {
		s.followPeer(now, ks)
	}

	sh := s.own(ks)
	if s.held(pol) {
		// Regions disagree on the rule: fail-static until they agree.
		s.planStep(ks, sh, nil, nil, p)
		return true
	}
	idle := now.Sub(ks.lastDemand) >= s.cfg.IdleAfter
	targets := s.targets(now, ks, pol, sh, idle)
	gifts := s.giftsFor(ks, sh, targets, idle)
	var takes []int64
	if ks.applied >= 0 {
		// A reclaim raises our share, so it is written after Commit, as
		// a Raise: never while the stored share is unknown and the whole
		// entry must be a Lower.
		takes = s.reclaims(now, ks, pol)
	}
	if idle && gifts == nil && takes == nil && s.canRetire(now, ks, sh) {
		s.retire(now, ks, p)
		return true
	}
	s.planStep(ks, sh, gifts, takes, p)
	return true
}

// smoothDemand moves each region's smoothed demand toward its tally; true: the key has demand.
func (s *State) smoothDemand(ks *keyState, pol KeyPolicy) bool {
	me := s.self
	active := s.cur(ks).demand > 0
	if s.tallied {
		active = active || ks.pub.demand > 0
	}
	// A region we do not hear keeps its smoothed demand (no news is not no
	// demand); once heard again it restarts from its latest tally, as the
	// old value says nothing about the epochs missed.
	for k := 0; k < s.n; k++ {
		bit := uint64(1) << k
		switch {
		case k == me && s.restored:
			// Our tallies of the epoch before the restart are lost:
			// hold our demand for one epoch rather than see a drop.
			active = active || ks.ewma()[k] >= 1
			continue
		case !s.fresh[k]:
			// Not idle while a region we cannot hear had demand.
			ks.unheard |= bit
			active = active || ks.ewma()[k] >= 1
			continue
		case ks.unheard&bit != 0:
			ks.unheard &^= bit
			ks.ewma()[k] = s.x[k]
			// Its tallies of the silence are lost, and it may have had
			// demand in it: a key in a generation is not idle until
			// IdleAfter from now (else keys seen now and then retired
			// after every silence). Not demand, which would make a key
			// without state enter a generation.
			if ks.gen != 0 {
				ks.lastDemand = s.now
			}
		default:
			s.follow(ks, k, pol)
		}
		active = active || s.x[k] > 0
	}
	return active
}

// follow moves region k's smoothed demand one epoch toward its tally s.x[k].
func (s *State) follow(ks *keyState, k int, pol KeyPolicy) {
	m := max(s.x[k], ks.ewma()[k])
	s.followGain(ks, k, pol.Cost, gain(m, pol.Cost, s.horizon(ks, k, pol, m)))
}

// followGain is follow with its gain g already worked out.
func (s *State) followGain(ks *keyState, k int, cost, g float64) {
	bit := uint64(1) << k
	a := s.cfg.Alpha * g * ks.turning(bit, s.x[k] > ks.ewma()[k])
	if ks.left(k, s.x[k], cost) {
		a = 1
	}
	ks.ewma()[k] = a*s.x[k] + (1-a)*ks.ewma()[k]
}

// catchUp runs region k's follow for a key waking from rest (rest.go), one
// epoch after another up to epochs of them, and stops at the first that
// changes nothing of the region: with the same tally the next would not
// either. The regions are independent (k's follow reads k's state and what
// rest holds still: its tally, the shares, the policy), so stopping each on
// its own leaves the state in which replaying whole epochs until none
// changes anything does, without stepping the regions that settled early.
// The gain depends on the state only through m, the larger of the tally
// and the smoothed demand, so it is kept while m is the same number; and
// while the smoothed demand moves toward a tally it has, the way it moved
// the epoch before, followGain's epoch is the EWMA's step alone.
// TestWakeAsReplay compares it with the replay.
func (s *State) catchUp(ks *keyState, k int, pol KeyPolicy, epochs uint64) {
	bit := uint64(1) << k
	x := s.x[k]
	var g float64
	var gm uint64
	hz := s.horizonOf(ks, k, pol)
	for i := uint64(0); i < epochs; {
		e, ms, rb := ks.ewma()[k], ks.missed()[k], ks.runBase()[k]
		bits := ks.moved&bit<<2 | ks.rose&bit<<1 | ks.flipped&bit
		m := max(x, e)
		if mb := math.Float64bits(m); i == 0 || mb != gm {
			g, gm = gain(m, pol.Cost, hz.at(m)), mb
		}
		same := 0b100 * bit // moved, not up, not turned
		if x > e {
			same = 0b110 * bit
		}
		if x > 0 && math.Float64bits(ms)|math.Float64bits(rb) == 0 && bits == same {
			// followGain: no turn (a factor of 1), and left keeps
			// nothing missed. While the EWMA rises, m stays the tally,
			// and so does the gain.
			a := s.cfg.Alpha * g
			for {
				ne := a*x + (1-a)*e
				i++
				if ne == e {
					ks.ewma()[k] = e
					return
				}
				e = ne
				if i == epochs || same != 0b110*bit || !(x > e) {
					break
				}
			}
			ks.ewma()[k] = e
			continue
		}
		s.followGain(ks, k, pol.Cost, g)
		i++
		if ks.ewma()[k] == e && ks.missed()[k] == ms && ks.runBase()[k] == rb &&
			ks.moved&bit<<2|ks.rose&bit<<1|ks.flipped&bit == bits {
			return
		}
	}
}

// dropDoneExits drops the key's exit records that need announcing no longer (exitDone).
func (s *State) dropDoneExits(now time.Time, ks *keyState) {
	live := ks.exits[:0]
	for _, x := range ks.exits {
		if !s.exitDone(now, ks, x) {
			live = append(live, x)
		}
	}
	clear(ks.exits[len(live):])
	ks.exits = live
}

// forgetAnnouncers stops acknowledging peers whose latest report leaves the key out (they forgot it).
func (s *State) forgetAnnouncers(ks *keyState) {
	for k := 0; k < s.n; k++ {
		if bit := uint64(1) << k; ks.announcing&bit != 0 && s.exchEpoch[k] != 0 && !s.listed(ks, k) {
			ks.announcing &^= bit
		}
	}
}

// canRetire decides whether an idle key moving nothing may retire: quiet for Grace, at rest, settled.
func (s *State) canRetire(now time.Time, ks *keyState, sh int64) bool {
	// A share the store may hold unknown to us (ks.applied < 0) waits: the
	// exit record would say we applied less than the store may.
	// Nor one an older generation's exit record of which is still owed
	// something by a peer: what comes back after we retire is lost.
	return ks.applied >= 0 && now.Sub(ks.lastTransfer) >= s.cfg.Grace && s.atRest(now, ks, sh) && s.settled(ks) && !s.owedByExits(now, ks)
}

// retire drops the key's generation at rest and lists the key in p.Retire.
func (s *State) retire(now time.Time, ks *keyState, p *Plan) {
	// At rest: leave the generation for none. The store falls back to the
	// initial share, which is at most what we hold.
	s.leave(now, ks, false)
	ks.gen, ks.base, ks.applied = 0, 0, -1
	p.Retire = append(p.Retire, ks.key)
}

// planStep decides the key's new applied share and adds it to p, unless nothing changes.
func (s *State) planStep(ks *keyState, sh int64, gifts, takes []int64, p *Plan) {
	ns := sh
	for k := 0; k < s.n; k++ {
		if gifts != nil {
			ns -= gifts[k]
		}
		if takes != nil {
			ns += takes[k]
		}
	}
	a := clamp(ns, 0, PPM)
	intake := !slices.Equal(ks.inTaken(), ks.inTakenStored())
	// A share written long ago is written again (Config.Rewrite), as a
	// Raise of the same value: the store may forget old shares.
	old := s.cfg.Rewrite > 0 && ks.applied >= 0 && !ks.written.IsZero() && s.now.Sub(ks.written) >= s.cfg.Rewrite
	if gifts == nil && takes == nil && a == ks.applied && !old {
		if intake {
			copy(ks.inTakenStored(), ks.inTaken()) // the store already reflects it
		}
		return
	}
	st := step{ks: ks, gen: ks.gen, applied: a, gifts: gifts, takes: takes}
	if intake {
		st.intake = s.rowBuf(ks.inTaken())
	}
	c := ks.change(a)
	c.step = int32(len(p.steps) + 1)
	if p.steps == nil { // sized as the latest plan's, not grown a step at a time
		p.steps = make([]step, 0, roomFor(s.sizes.steps))
	}
	// A Lower when the share goes down or the stored share is unknown (it is
	// written before Commit), a Raise when it goes up.
	switch {
	case ks.applied < 0 || a < ks.applied:
		st.entry = 1
		if p.Lower == nil {
			p.Lower = make([]ShareChange, 0, roomFor(s.sizes.lower))
		}
		p.Lower = append(p.Lower, c)
	case a > ks.applied || old:
		st.entry = 2
		if p.Raise == nil {
			p.Raise = make([]ShareChange, 0, roomFor(s.sizes.raise))
		}
		p.Raise = append(p.Raise, c)
	}
	p.steps = append(p.steps, st)
}

// noiseRequests is the count of requests an epoch at which a region's
// demand is followed at half the EWMA's weight: Poisson noise is 1/√n of n
// requests, and a gain of n/(n+4) is about the Kalman gain for a demand
// that may change by half in an epoch. Keys seen thousands of times an epoch
// are followed at nearly Alpha; keys seen a few times barely move.
const noiseRequests = 4

// gain scales Alpha for a region whose demand is m tokens an epoch (the
// larger of its tally and its smoothed demand, so that a demand appearing
// or vanishing is followed at once).
func gain(m, cost, horizon float64) float64 {
	n := m / perRequest(cost)
	return n / (n + noiseRequests*horizon)
}

// horizon is the factor on noiseRequests for region k's demand of m
// tokens an epoch: bucketHorizon, but no slower than the region's part of
// the bucket can cover. With gain g, a step of demand to m above what the
// region's share serves (sh, in tokens an epoch) drains about (m − sh)/g
// tokens before the smoothed demand catches up, which must fit in the part
// (Burst / regions); a demand the share serves drains nothing.
func (s *State) horizon(ks *keyState, k int, pol KeyPolicy, m float64) float64 {
	r := s.horizonOf(ks, k, pol)
	return r.at(m)
}

// regionHorizon is what horizon reads beside m, for a key's region k, kept
// by catchUp, which asks it at many m: the region's share, worked out at
// the first m that needs it.
type regionHorizon struct {
	s     *State
	ks    *keyState
	k     int
	pol   KeyPolicy
	share int64
	known bool // share is
}

func (s *State) horizonOf(ks *keyState, k int, pol KeyPolicy) regionHorizon {
	return regionHorizon{s: s, ks: ks, k: k, pol: pol}
}

// at is horizon at m.
func (r *regionHorizon) at(m float64) float64 {
	s, pol := r.s, r.pol
	h := s.bucketHorizon(pol, m)
	if h == 1 {
		return 1
	}
	per := pol.Rate * s.periodSec
	if !r.known {
		r.share, r.known = r.ks.shares()[r.k], true
		if r.k == s.self {
			r.share = s.own(r.ks)
		}
	}
	if over := m - float64(max(r.share, 0))/PPM*per; over > 0 {
		// (m − sh)(n + noiseRequests·h)/(Alpha·n) ≤ part, n = m/cost requests.
		n := m / perRequest(pol.Cost)
		part := pol.Burst / float64(s.n)
		h = min(h, (s.cfg.Alpha*part*n/over-n)/noiseRequests)
	}
	return max(1, h)
}

// bucketHorizon is how many epochs a key's bucket absorbs the Poisson noise
// of a demand of m tokens an epoch, for a demand under the key's rate whose
// noise is wider than SettledPPM of the rate (a few requests an epoch): as
// long as a region's part of the bucket (Burst / regions) serves m, at most
// as long as the whole bucket serves the rate. Its shares need follow that
// noise no faster. Any other demand (over the rate, or of so many requests
// that their noise cannot move a share past the band), a key whose burst
// is not above a period's rate and a fixed window's key (its bucket does
// not refill within the window: with the horizon, window-boundary's
// per-second utilization fell 35.38 → 35.05%) get 1.
func (s *State) bucketHorizon(pol KeyPolicy, m float64) float64 {
	per := pol.Rate * s.periodSec
	if pol.FixedWindow || !(per > 0) || !(pol.Burst > per) || m > per || s.cfg.SettledPPM < 0 || noise(m, pol.Cost)/per*PPM <= float64(s.cfg.SettledPPM) {
		return 1
	}
	h := pol.Burst / per
	if part := pol.Burst / float64(s.n); m*h > part {
		h = part / m
	}
	return max(1, h)
}

// left reports whether region k's demand left: no request in the epochs
// since its last one, where its smoothed demand when they stopped expected
// noiseRequests of them (Poisson: probability e⁻⁴, under 2%). The demand is
// then dropped at once, not in a long tail of a few tokens an epoch (the
// gain falls with the demand, so it decays as 1/t), which for a quota of a
// few tokens a second, or a day, is a full share's need: one request an
// epoch that stopped is gone in 4 epochs, 4 requests or more in one.
func (ks *keyState) left(k int, tally, cost float64) bool {
	if tally > 0 {
		ks.missed()[k], ks.runBase()[k] = 0, 0
		return false
	}
	if ks.missed()[k] == 0 {
		ks.runBase()[k] = ks.ewma()[k] / perRequest(cost)
	}
	ks.missed()[k] += ks.runBase()[k]
	if ks.missed()[k] < noiseRequests || ks.ewma()[k] == 0 {
		return false
	}
	ks.missed()[k], ks.runBase()[k] = 0, 0
	return true
}

// noise is one standard deviation, in tokens, of an epoch's demand of m
// tokens in requests of cost tokens: cost × √(m/cost).
func noise(m, cost float64) float64 {
	return math.Sqrt(max(m, 0) * perRequest(cost))
}

// perRequest is KeyPolicy.Cost with its default: 1 token a request.
func perRequest(cost float64) float64 {
	if !(cost > 0) {
		return 1
	}
	return cost
}

// turning records which way the region at bit moved its smoothed demand
// (up or not) and returns the factor on its EWMA weight: a third when it
// turned at the last move and turns again now (demand oscillating faster
// than shares can follow), else 1.
func (ks *keyState) turning(bit uint64, up bool) float64 {
	flip := ks.moved&bit != 0 && (ks.rose&bit != 0) != up
	f := 1.0
	if flip && ks.flipped&bit != 0 {
		f = 1.0 / 3
	}
	ks.flipped = setBit(ks.flipped, bit, flip)
	ks.rose = setBit(ks.rose, bit, up)
	ks.moved |= bit
	return f
}

func setBit(m, bit uint64, on bool) uint64 {
	if on {
		return m | bit
	}
	return m &^ bit
}
