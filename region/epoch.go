package region

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Plan is the outbox of one Epoch: the store writes the caller must carry
// out, in the order documented on State.Epoch.
type Plan struct {
	// Epoch is the epoch number the plan belongs to.
	Epoch uint64
	// Lower are shares to write to the store BEFORE Commit: each is at or
	// below the share the store may hold, and this epoch's gifts are
	// already taken out of it. Remove the entries whose write was not
	// confirmed before calling Commit; their keys give nothing this epoch.
	Lower []ShareChange
	// Raise are shares to write after Commit (gifts received, or our gifts
	// outweighed by those received). Their outcome never matters for
	// safety; call Resync for a key whose write failed.
	Raise []ShareChange
	// Retire are keys whose exchange state was dropped at rest: delete
	// their stored share after Commit, so the bucket falls back to the
	// region's initial share.
	Retire []string

	seq   uint64
	steps []step
}

// ShareChange sets the applied share of Key in this region's store.
type ShareChange struct {
	Key      string
	SharePPM int64

	step int32 // 1 + index in Plan.steps
}

// step is one key's part of a plan: the new applied share and the gifts and
// reclaims to record at Commit.
type step struct {
	ks      *keyState
	gen     uint64
	applied int64
	gifts   []int64 // nil: none
	takes   []int64 // nil: none
	intake  []int64 // inTaken when planned, to acknowledge at Commit (nil: unchanged)
	entry   int8    // 0 none, 1 Lower, 2 Raise
}

// Epoch runs one sync step for every active key at now (DESIGN.md, "Each
// epoch", steps 2 to 5, on the reports received so far) and returns what to
// write. It closes the local tallies of the epoch, updates the demand EWMA,
// moves keys to the newest generation, retires keys at rest, and decides
// gifts and reclaims. Gifts are not given until Commit.
//
// The caller, which owns the store, then does exactly this:
//
//	plan := s.Epoch(now)
//	write plan.Lower to the store; drop the entries not confirmed
//	s.Commit(plan)        // records the gifts in our row
//	persist s.Snapshot()  // in the region's store; if it fails, stop here
//	publish s.Report()
//	write plan.Raise, delete plan.Retire
//
// Lowering before committing means no share is ever visible to a peer while
// we still apply it; persisting before publishing means a restarted or
// failed-over replica never forgets a gift a peer may have seen. A plan that
// is not committed gives nothing: the next Epoch recomputes, and rewrites
// the shares of the keys it touched before any gift.
func (s *State) Epoch(now time.Time) Plan {
	if s.tallied {
		s.now = now // the second phase: Tally numbered the epoch
	} else {
		s.advance(now)
	}
	if !s.committed {
		for _, st := range s.open {
			st.ks.applied = -1 // the Lower write may or may not have happened
		}
	}
	s.pruneReplicas(now)
	s.seq++
	s.committed = false
	p := Plan{Epoch: s.epoch, seq: s.seq}
	for i := 0; i < len(s.keys); {
		if s.epochKey(now, s.keys[i], &p) {
			i++
		} else {
			s.removeKey(i)
		}
	}
	s.open = p.steps
	s.restored, s.tallied = false, false
	return p
}

// advance moves the clock and the epoch number.
func (s *State) advance(now time.Time) {
	s.now = now
	e := uint64(0)
	if ns := now.UnixNano(); ns > 0 {
		e = uint64(ns / int64(s.cfg.Period))
	}
	s.epoch = max(s.epoch+1, e)
}

// epochKey runs the epoch for one key; false drops the key.
func (s *State) epochKey(now time.Time, ks *keyState, p *Plan) bool {
	n, me, cfg := s.n, s.self, &s.cfg
	if ks.created.IsZero() {
		ks.created, ks.lastDemand, ks.lastTransfer = now, now, now
	}

	// Demand: the EWMA steers by the tallies everyone saw last epoch. A
	// region we do not hear keeps its smoothed demand (no news is not no
	// demand); once heard again it restarts from its latest tally, as the
	// old value says nothing about the epochs missed.
	s.demands(ks, now)
	pol := cfg.Policy(ks.key)
	active := ks.cur0.demand > 0
	if s.tallied {
		active = active || ks.pub.demand > 0
	}
	for k := 0; k < n; k++ {
		bit := uint64(1) << k
		switch {
		case k == me && s.restored:
			// Our tallies of the epoch before the restart are lost:
			// hold our demand for one epoch rather than see a drop.
			active = active || ks.ewma[k] >= 1
			continue
		case !s.fresh[k]:
			// Not idle while a region we cannot hear had demand.
			ks.unheard |= bit
			active = active || ks.ewma[k] >= 1
			continue
		case ks.unheard&bit != 0:
			ks.unheard &^= bit
			ks.ewma[k] = s.x[k]
		default:
			a := cfg.Alpha * gain(max(s.x[k], ks.ewma[k]), pol.Cost) * ks.turning(bit, s.x[k] > ks.ewma[k])
			ks.ewma[k] = a*s.x[k] + (1-a)*ks.ewma[k]
		}
		active = active || s.x[k] > 0
	}
	if active {
		ks.lastDemand = now
	}
	if !s.tallied {
		ks.pub, ks.cur0 = ks.cur0, tally{}
	}
	live := ks.exits[:0]
	for _, x := range ks.exits {
		if !s.exitDone(now, ks, x) {
			live = append(live, x)
		}
	}
	clear(ks.exits[len(live):])
	ks.exits = live

	// A peer whose latest exchange report leaves the key out announces no
	// exit record for it: it forgot the key, and needs no acknowledgement.
	for k := 0; k < n; k++ {
		if bit := uint64(1) << k; ks.announcing&bit != 0 && s.exchEpoch[k] != 0 && ks.seen[k] != s.exchEpoch[k] {
			ks.announcing &^= bit
		}
	}

	// Generation: enter one, or follow a peer to a newer one.
	if ks.gen == 0 {
		if !active && !s.pendingGifts(ks) {
			// Keep a tombstone announcing its exit, a key a peer still
			// exchanges (to join its generation on demand), or one whose
			// peers' exit records we acknowledge.
			return len(ks.exits) > 0 || ks.announcing != 0 || s.highestPeerGen(ks) > 0
		}
		s.enter(now, ks, s.initial[me])
	} else if g := s.highestPeerGen(ks); g > ks.gen {
		// Carry our share over, without the reclaims the victims have not
		// acknowledged: a generation change ends a reclaim, and what the
		// victim did not apply stays the victim's.
		s.leave(now, ks, true)
		s.enter(now, ks, clamp(s.exitShare(ks), -PPM, PPM))
	}

	sh := s.own(ks)
	idle := now.Sub(ks.lastDemand) >= cfg.IdleAfter
	targets := s.targets(now, ks, pol, sh, idle)
	gifts := s.giftsFor(ks, sh, targets, idle)
	var takes []int64
	if ks.applied >= 0 {
		// A reclaim raises our share, so it is written after Commit, as
		// a Raise: never while the stored share is unknown and the whole
		// entry must be a Lower.
		takes = s.reclaims(now, ks, pol)
	}
	if idle && gifts == nil && takes == nil && now.Sub(ks.lastTransfer) >= cfg.Grace && s.atRest(now, ks, sh) && s.settled(ks) {
		// At rest: leave the generation for none. The store falls back to
		// the initial share, which is at most what we hold.
		s.leave(now, ks, false)
		ks.gen, ks.base, ks.applied = 0, 0, -1
		p.Retire = append(p.Retire, ks.key)
		return true
	}

	ns := sh
	for k := 0; k < n; k++ {
		if gifts != nil {
			ns -= gifts[k]
		}
		if takes != nil {
			ns += takes[k]
		}
	}
	a := clamp(ns, 0, PPM)
	intake := !slices.Equal(ks.inTaken, ks.inTakenStored)
	if gifts == nil && takes == nil && a == ks.applied {
		if intake {
			copy(ks.inTakenStored, ks.inTaken) // the store already reflects it
		}
		return true
	}
	st := step{ks: ks, gen: ks.gen, applied: a, gifts: gifts, takes: takes}
	if intake {
		st.intake = s.rowBuf(ks.inTaken)
	}
	c := ShareChange{Key: ks.key, SharePPM: a, step: int32(len(p.steps) + 1)}
	switch {
	case ks.applied < 0 || a < ks.applied:
		st.entry = 1
		p.Lower = append(p.Lower, c)
	case a > ks.applied:
		st.entry = 2
		p.Raise = append(p.Raise, c)
	}
	p.steps = append(p.steps, st)
	return true
}

// rowBuf returns a new row for a plan's step, a copy of v (zero when v is
// nil), carved from a larger allocation so that a plan moving many keys
// allocates a few slabs rather than a row per key.
func (s *State) rowBuf(v []int64) []int64 {
	if len(s.slab) < s.n {
		s.slab = make([]int64, max(1024, 64*s.n))
	}
	row := s.slab[:s.n:s.n]
	s.slab = s.slab[s.n:]
	if v == nil {
		clear(row)
	} else {
		copy(row, v)
	}
	return row
}

// targets returns every region's target share for the key. Peers heard
// lately are live: those in our generation can receive gifts, the others
// (no exchange state yet, or another generation) will join ours within an
// epoch, bringing their share, so they take part in the water-filling but
// receive nothing yet. Peers not heard are frozen at their current share
// (fail-static) and the water-filling divides what is left.
func (s *State) targets(now time.Time, ks *keyState, pol KeyPolicy, sh int64, idle bool) []int64 {
	n, me, cfg := s.n, s.self, &s.cfg
	s.live = s.live[:0]
	var frozen int64
	for k := 0; k < n; k++ {
		s.recv[k] = false
		if k == me {
			s.v[k] = sh
			s.live = append(s.live, k)
			continue
		}
		g := s.peerGen(ks, k)
		inGen := g == ks.gen && ks.rowGen[k] == ks.gen
		switch {
		case inGen:
			s.v[k] = s.view(ks, k)
		case g != 0:
			s.v[k] = ks.shares[k] // in another generation, on its way to ours
		default:
			s.v[k] = s.initial[k] // no state: the store's initial share
		}
		heard := !s.exchHeard[k].IsZero() && now.Sub(s.exchHeard[k]) <= cfg.StaleAfter
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
	if idle {
		for _, k := range s.live {
			s.t[k] = s.initial[k]
		}
		return s.t
	}
	s.need, s.weights = s.need[:0], s.weights[:0]
	var sum float64
	for _, k := range s.live {
		sum += ks.ewma[k]
	}
	for _, k := range s.live {
		var need float64
		switch {
		case pol.Rate > 0:
			per := pol.Rate * cfg.Period.Seconds()
			need = ks.ewma[k] / per * PPM
			// Headroom for Poisson noise: one standard deviation of the
			// epoch's demand, where it exceeds the floor (small keys).
			if h := noise(ks.ewma[k], pol.Cost) / per * PPM; h > float64(cfg.FloorPPM) {
				need += h - float64(cfg.FloorPPM)
			}
		case sum > 0:
			need = ks.ewma[k] / sum * PPM
		}
		s.need = append(s.need, need)
		s.weights = append(s.weights, s.initial[k])
	}
	lt := s.lt[:len(s.live)]
	s.tg.fill(lt, PPM-frozen, s.need, cfg.FloorPPM, s.weights)
	for i, k := range s.live {
		s.t[k] = lt[i]
	}
	return s.t
}

// giftsFor splits our surplus over the live peers below target, in
// proportion to their deficits: when every giver does so with the same view,
// each deficit is filled exactly in one epoch.
func (s *State) giftsFor(ks *keyState, sh int64, t []int64, idle bool) []int64 {
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
		if k == s.self || tk[k] > 0 || ks.rowGen[k] != ks.gen || s.peerGen(ks, k) != ks.gen {
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

// Commit records the gifts and reclaims of p in our rows and its shares as
// applied, once the caller has written p.Lower (see Epoch). Entries removed
// from p.Lower give nothing and leave the key's applied share unknown, so
// the next Epoch writes it again. It returns ErrStalePlan for a plan that is
// not the latest or was committed already, and ErrInvalidPlan for entries
// that Epoch did not produce; then nothing is recorded.
func (s *State) Commit(p Plan) error {
	if p.seq == 0 || p.seq != s.seq || s.committed {
		return fmt.Errorf("%w: plan %d, latest %d", ErrStalePlan, p.seq, s.seq)
	}
	if cap(s.kept) < len(p.steps) {
		s.kept = make([]bool, len(p.steps))
	}
	kept := s.kept[:len(p.steps)]
	clear(kept)
	for _, list := range []struct {
		cs    []ShareChange
		entry int8
	}{{p.Lower, 1}, {p.Raise, 2}} {
		for _, c := range list.cs {
			i := int(c.step) - 1
			if i < 0 || i >= len(p.steps) || p.steps[i].entry != list.entry || p.steps[i].ks.key != c.Key || p.steps[i].applied != c.SharePPM {
				return fmt.Errorf("%w: entry %q=%d", ErrInvalidPlan, c.Key, c.SharePPM)
			}
			kept[i] = true
		}
	}
	for i := range p.steps {
		st := &p.steps[i]
		ks := st.ks
		if st.entry == 1 && !kept[i] {
			ks.applied = -1 // the write may have happened; gifts wait
			continue
		}
		if ks.gen != st.gen || s.byKey[ks.key] != ks {
			continue // cannot happen between Epoch and Commit; stay safe
		}
		row, tk := s.ownRow(ks), s.ownTaken(ks)
		for k := range row {
			if st.gifts != nil {
				row[k] += st.gifts[k]
			}
			if st.takes != nil {
				tk[k] += st.takes[k]
			}
		}
		if st.gifts != nil || st.takes != nil {
			ks.lastTransfer = s.now
		}
		if st.entry != 2 || kept[i] {
			ks.applied = st.applied
		}
		if st.intake != nil {
			copy(ks.inTakenStored, st.intake)
		}
	}
	s.committed = true
	return nil
}

// Apply returns the keys whose share rose since it was last written, because
// peers' gifts (or refunds) arrived, with the share to write: DESIGN.md
// "Each epoch", step 5, done on receipt rather than at the next epoch, so
// that a gift is in use a network delay after it was given. Call it after
// Receive and write the changes; a write that fails needs Resync. Raising
// is always safe (our computed share is never above our true share), so the
// order of these writes does not matter.
//
// It returns nothing between an Epoch and its Commit (the plan's Lower
// writes decide the stored shares then), for a key whose stored share is
// unknown (the next Epoch writes it), and for a key with a reclaim on us not
// yet written (the next Epoch lowers it).
func (s *State) Apply() []ShareChange {
	if !s.committed {
		return nil // keep the list for after the Commit
	}
	var out []ShareChange
	for _, ks := range s.toApply {
		ks.toApply = false
		if s.byKey[ks.key] != ks || ks.gen == 0 || ks.applied < 0 || !slices.Equal(ks.inTaken, ks.inTakenStored) {
			continue
		}
		if a := clamp(s.own(ks), 0, PPM); a > ks.applied {
			ks.applied = a
			out = append(out, ShareChange{Key: ks.key, SharePPM: a})
		}
	}
	clear(s.toApply)
	s.toApply = s.toApply[:0]
	return out
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
func gain(m, cost float64) float64 {
	n := m / perRequest(cost)
	return n / (n + noiseRequests)
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
