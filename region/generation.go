package region

import "time"

// This file holds the generation rules of a key's exchange state: entering
// and leaving generations, exit records, and when a key is at rest. See
// "Generations and idle keys" in the package documentation.

// pendingGifts reports whether a peer has given us share in a generation we
// may enter.
func (s *State) pendingGifts(ks *keyState) bool {
	for k := 0; k < s.n; k++ {
		if g := ks.rowGen()[k]; g > max(s.genFloor, ks.floor) && g == s.peerGen(ks, k) && ks.rows()[k*s.n+s.self] > 0 {
			return true
		}
	}
	return false
}

// keepTombstone decides whether a key outside any generation and without demand is kept.
func (s *State) keepTombstone(ks *keyState) bool {
	// Keep a tombstone announcing its exit, a key a peer still exchanges
	// (to join its generation on demand), or one whose peers' exit
	// records we acknowledge.
	return len(ks.exits) > 0 || ks.announcing != 0 || s.highestPeerGen(ks) > 0
}

// followPeer moves the key to the newer generation a peer is in, carrying our share over.
func (s *State) followPeer(now time.Time, ks *keyState) {
	// Carry our share over, without the reclaims the victims have not
	// acknowledged: a generation change ends a reclaim, and what the victim
	// did not apply stays the victim's.
	s.leave(now, ks, true)
	s.enter(now, ks, clamp(s.exitShare(ks), -PPM, PPM))
}

// enter puts the key in the newest generation a peer is in, or in a new one
// when we may not enter that (we left it, or one newer), with base share.
func (s *State) enter(now time.Time, ks *keyState, base int64) {
	n, me := s.n, s.self
	g := s.highestPeerGen(ks)
	if floor := max(s.genFloor, ks.floor); g <= floor {
		g = max(s.epoch, floor+1)
	}
	ks.gen, ks.base = g, base
	clear(s.ownRow(ks))
	clear(s.ownTaken(ks))
	clear(ks.in())
	clear(ks.inTaken())
	clear(ks.refund())
	clear(ks.unclaim())
	clear(ks.ack())
	clear(ks.ackTkn())
	clear(ks.inTakenStored())
	clear(ks.tok())
	clear(ks.tokIn()) // tokens given in older generations are never credited now
	clear(ks.tokInWin())
	ks.tokWin, ks.tokCredited, ks.tokCreditedWin = 0, 0, 0
	ks.rowGen()[me] = g
	ks.bases()[me] = base
	for k := 0; k < n; k++ {
		if k != me && ks.rowGen()[k] == g {
			ks.in()[k] = ks.rows()[k*n+me]
			ks.inTaken()[k] = ks.taken()[k*n+me]
		}
	}
	ks.lastTransfer = now
}

// atRest reports whether we can drop the key without losing share or
// forcing a generation change: our share is not below our initial share
// (leaving then would raise it); every peer in our generation, or whose
// state we do not know (after a restart), is heard (a silent one may have
// demand we cannot see); and any surplus we hold is not owed to a peer
// below its initial share, which we know only when every peer is heard and
// in our generation, or has no state for the key.
func (s *State) atRest(now time.Time, ks *keyState, sh int64) bool {
	init := s.initial[s.self]
	if sh < init {
		return false
	}
	for k := 0; k < s.n; k++ {
		if k == s.self {
			continue
		}
		heard := !s.exchHeard[k].IsZero() && now.Sub(s.exchHeard[k]) <= s.cfg.StaleAfter
		g := s.peerGen(ks, k)
		switch {
		case !heard && (g == ks.gen || sh > init || !s.known(ks, k)):
			return false
		case sh > init && g != 0 && (g != ks.gen || ks.rowGen()[k] != ks.gen || s.firmView(ks, k) < s.initial[k] || ks.shares()[k] < s.initial[k]):
			// k's share as it reported it too: a view lacks the rows
			// of a region that left before we restarted and whose
			// exit record is gone (finalRow), k's own share does not.
			return false // (g == 0: no state there, it holds its initial share)
		case sh > init && g == 0 && !s.known(ks, k):
			return false // not listed in its stream of deltas yet: it may hold less

		}
	}
	return true
}

// settled reports whether every gift and reclaim we made in the key's
// generation was acknowledged by its recipient, or settled by the
// recipient's exit record, so that retiring loses nothing in flight. A key
// with a gift to a silent region waits for it, however long.
func (s *State) settled(ks *keyState) bool {
	row, tk := s.ownRow(ks), s.ownTaken(ks)
	for k := 0; k < s.n; k++ {
		if k != s.self && (row[k]-ks.refund()[k] > ks.ack()[k] || tk[k]-ks.unclaim()[k] > ks.ackTkn()[k]) {
			return false
		}
	}
	return true
}

// exitDone reports whether the exit record of a generation we left can be
// dropped. Peers settle against it (they take back gifts we never applied,
// or learn the reclaims we did apply), and a lost record loses share, so it
// is announced for Grace, and longer until every peer has acknowledged
// settling against it and our own gifts there are settled; but not past
// 10 × IdleAfter: a peer silent that long costs that share, so that memory
// stays bounded.
func (s *State) exitDone(now time.Time, ks *keyState, x *exitState) bool {
	age := now.Sub(x.at)
	if age < s.cfg.Grace {
		return false
	}
	if age >= 10*s.cfg.IdleAfter {
		return true
	}
	for k := 0; k < s.n; k++ {
		if k != s.self && x.acked&(1<<k) == 0 {
			return false
		}
	}
	for k := 0; k < s.n; k++ {
		if k != s.self && s.awaitsExit(ks, x, k) {
			return false
		}
	}
	return true
}

// awaitsExit reports whether our exit record x waits for peer k's own exit
// record of the same generation, while we may be owed something from it:
// gifts k did not acknowledge (they come back if k never applied them), or
// reclaims we gave up that k may have applied.
func (s *State) awaitsExit(ks *keyState, x *exitState, k int) bool {
	owed := x.row[k]-x.refund[k] > x.ack[k] || x.dropped[k] > 0
	return owed && ks.settled()[k] < x.gen
}

// owedByExits reports whether an exit record of ks younger than
// 10 × IdleAfter waits for a peer's (awaitsExit): a key retired then would
// lose what comes back (settle), so it does not retire yet.
func (s *State) owedByExits(now time.Time, ks *keyState) bool {
	for _, x := range ks.exits {
		if now.Sub(x.at) >= 10*s.cfg.IdleAfter {
			continue
		}
		for k := 0; k < s.n; k++ {
			if k != s.self && s.awaitsExit(ks, x, k) {
				return true
			}
		}
	}
	return false
}

// firmView is view(ks, k) without k's reclaims from regions that left our
// generation. A generation change ends a reclaim: what the victim had not
// applied stays the victim's, and k gives it up when it settles against the
// victim's exit record, which we may hear of before k does, and k's report
// of it after we decided. A region that retired above its initial share on
// a view of k that counted such a reclaim lost the difference for good once
// k gave the reclaim up and fell below its own (66,097 ppm of reclaim/f in
// TestRetireOnFirmViews). Once k has given it up its reported base says so
// and this subtracts it twice: a region then keeps the key, giving its
// surplus to k or waiting for k to retire, a little longer.
func (s *State) firmView(ks *keyState, k int) int64 {
	v := s.view(ks, k)
	for j := 0; j < s.n; j++ {
		if j != s.self && j != k && (ks.rowGen()[j] != ks.gen || s.peerGen(ks, j) != ks.gen) {
			v -= ks.taken()[k*s.n+j]
		}
	}
	return v
}

// finalRow takes peer k's exit record x of our generation as k's row there:
// k's gifts to, and reclaims from, a third region still count in that
// region's share, so our view of it needs them. Peers' rows are not
// persisted, and a region that left reports only this record: a region that
// restarted after k retired viewed a peer k had reclaimed from without the
// reclaim, as at its initial share, retired 91,016 ppm above its own on that
// view, and the peer was left below its initial share with nobody owing it
// any more (reclaim/g in TestRetireOnLeaversRows).
func (s *State) finalRow(now time.Time, ks *keyState, k int, x *Exit, cols []int) {
	if ks.rowGen()[k] > ks.gen {
		return // k's row in the newer generation it moved to, which we will follow into
	}
	n := s.n
	row, tk := ks.rows()[k*n:(k+1)*n], ks.taken()[k*n:(k+1)*n]
	changed := false
	if ks.rowGen()[k] != ks.gen {
		// Not held in our generation (an older one's, or none): its
		// base is unknown, but k has left, so nobody views k itself.
		clear(row)
		clear(tk)
		ks.rowGen()[k] = ks.gen
		changed = true
	}
	for c, j := range cols {
		if j < 0 || j == k {
			continue
		}
		if c < len(x.Row) && x.Row[c] > row[j] {
			row[j], changed = x.Row[c], true
		}
		if c < len(x.Taken) && x.Taken[c] > tk[j] {
			tk[j], changed = x.Taken[c], true
		}
	}
	if changed {
		ks.lastTransfer = now
	}
}

// alloc sizes an exit record's rows for n regions.
func (x *exitState) alloc(n int) {
	buf := make([]int64, 7*n)
	x.row, x.taken, x.in = buf[:n:n], buf[n:2*n:2*n], buf[2*n:3*n:3*n]
	x.intake, x.refund, x.ack, x.dropped = buf[3*n:4*n:4*n], buf[4*n:5*n:5*n], buf[5*n:6*n:6*n], buf[6*n:]
}

// unacked returns the part of our reclaim from k that k has not applied.
func (s *State) unacked(ks *keyState, k int) int64 {
	return max(s.ownTaken(ks)[k]-ks.unclaim()[k]-ks.ackTkn()[k], 0)
}

// exitShare is the share we carry into a new generation: ours, without the
// reclaims not acknowledged.
func (s *State) exitShare(ks *keyState) int64 {
	sh := s.own(ks)
	for k := 0; k < s.n; k++ {
		sh -= s.unacked(ks, k)
	}
	return sh
}

// leave records the exit of the key's generation. We never enter it again:
// our row there is final, which lets peers settle against it. When moving
// on, the reclaims not acknowledged are given up and left out of the record.
func (s *State) leave(now time.Time, ks *keyState, moving bool) {
	x := &exitState{gen: ks.gen, at: now}
	x.alloc(s.n)
	copy(x.row, s.ownRow(ks))
	copy(x.taken, s.ownTaken(ks))
	if moving {
		for k := range x.taken {
			x.dropped[k] = s.unacked(ks, k)
			x.taken[k] -= x.dropped[k]
		}
	}
	copy(x.in, ks.in())
	copy(x.intake, ks.inTaken())
	copy(x.refund, ks.refund())
	copy(x.ack, ks.ack())
	ks.exits = append(ks.exits, x)
	ks.floor = max(ks.floor, ks.gen)
	ks.lastTransfer = now
}
